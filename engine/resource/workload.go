package resource

// Workloads: the inventory of what data planes see (docs/workloads.md). A
// Workload names a set of addresses, optionally a principal (a certificate
// identity) and per-port tags, and gives them tags; requests may then name an
// endpoint by workload, address, principal or identity instead of by tags
// (endpoint.go).

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The reserved tag keys: an endpoint resolved from an address carries `ip`, one
// resolved from a principal carries `principal`. Workload tags and port tags may
// not use them, and identities leave them out. Kuma's spiffeID matches compile
// to selectors on PrincipalTag (docs/kuma.md).
const (
	IPTag        = "ip"
	PrincipalTag = "principal"
)

// IsReservedTag reports whether k is one of the reserved tag keys.
func IsReservedTag(k string) bool { return k == IPTag || k == PrincipalTag }

// Workload is one entry of a mesh's inventory: a set of addresses (each belongs
// to at most one workload of the mesh), an optional principal (several
// workloads may share one), tags, and optional per-port tags.
type Workload struct {
	Mesh      string
	Name      string
	Tags      map[string]string
	Addresses []string // canonical text of netip.Addr, unmapped, no zone
	Principal string
	Ports     []WorkloadPort
	Meta      Meta
}

// WorkloadPort adds tags to a workload when it is the destination of a flow to
// Port (a Kuma inbound).
type WorkloadPort struct {
	Port uint32
	Tags map[string]string
}

// Key implements Resource.
func (w *Workload) Key() Key { return Key{Kind: KindWorkload, Mesh: w.Mesh, Name: w.Name} }

// Metadata implements Resource.
func (w *Workload) Metadata() Meta { return w.Meta }

// WithMeta implements Resource.
func (w *Workload) WithMeta(meta Meta) Resource { c := *w; c.Meta = meta; return &c }

// Identity returns the identity of the workload's own tag set in its mesh.
func (w *Workload) Identity() uint64 { return Identity(w.Mesh, w.Tags) }

// Identity is the numeric identity of a tag set in a mesh (docs/workloads.md):
// the first 8 bytes, big-endian, of SHA-256 over the mesh name, a 0 byte, then
// the tag pairs sorted by key, each as key, 0 byte, value, 0 byte. The reserved
// keys (ip, principal) are left out. Every party computes it alike.
func Identity(mesh string, tags map[string]string) uint64 {
	if mesh == "" {
		mesh = DefaultMesh
	}
	var keysBuf [MaxTagsPerWorkload]string
	keys := keysBuf[:0]
	for k := range tags {
		if !IsReservedTag(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	// The input in one buffer, on the stack for the usual tag set, hashed in
	// one call: a hash.Hash and a []byte per Write would allocate on every
	// tag-form answer (each reports its endpoints' identities).
	var buf [512]byte
	in := append(append(buf[:0], mesh...), 0)
	for _, k := range keys {
		in = append(append(in, k...), 0)
		in = append(append(in, tags[k]...), 0)
	}
	sum := sha256.Sum256(in)
	return binary.BigEndian.Uint64(sum[:8])
}

// CanonicalAddress parses an IP address as workloads and requests give it and
// returns its canonical text: IPv4-mapped IPv6 addresses are unmapped (a kernel
// reports ::ffff:10.0.0.1 for 10.0.0.1); zones are refused.
func CanonicalAddress(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("%q is not an IP address", s)
	}
	if a.Zone() != "" {
		return "", fmt.Errorf("%q has a zone: give the address without it", s)
	}
	return a.Unmap().String(), nil
}

// TagsKey is a tag set as one string, equal for equal sets: the keys in
// order, each key and value followed by NUL (no tag holds a control
// character).
func TagsKey(t Tags) string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(t[k])
		b.WriteByte(0)
	}
	return b.String()
}

// SameTagSet reports whether a and b hold the same pairs.
func SameTagSet(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ResolvedTags is the workload's tags as an endpoint: its own tags, plus the
// tags of its first ports entry for port (0: none; port tags win over its own),
// plus ip: addr when addr is given. It returns w.Tags itself when it adds
// nothing.
func (w *Workload) ResolvedTags(port uint32, addr string) Tags {
	pt, _ := w.PortTags(port)
	if len(pt) == 0 && addr == "" {
		if w.Tags == nil {
			return Tags{}
		}
		return w.Tags
	}
	out := make(Tags, len(w.Tags)+len(pt)+1)
	for k, v := range w.Tags {
		out[k] = v
	}
	for k, v := range pt {
		out[k] = v
	}
	if addr != "" {
		out[IPTag] = addr
	}
	return out
}

// PortTags returns the tags of the first ports entry for port, or nil.
func (w *Workload) PortTags(port uint32) (map[string]string, bool) {
	if port == 0 {
		return nil, false
	}
	for _, p := range w.Ports {
		if p.Port == port {
			return p.Tags, true
		}
	}
	return nil, false
}

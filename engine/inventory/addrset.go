package inventory

// Address sets: a rule's peer selector as a kernel sees peers — addresses
// (docs/api.md, WatchRules with address sets). A kernel sees a peer's address
// and nothing else, so a peer matches a selector when the endpoint Decide
// resolves from that address does: a workload's address → the workload's own
// tags plus `ip: ADDRESS` (no per-port tags, no principal: a set holds
// addresses, not ports or certificates); an address no workload holds →
// `{ip: ADDRESS}`.
//
// The reading, per selector (PlanPeer):
//   - only requirements on `ip` (CIDR, In, an exact value, NotIn, Exists)
//     that select some addresses: the addresses they select, whoever holds
//     them, passed through as CIDRs (PeerCIDRs);
//   - a requirement no `{ip: ADDRESS}` endpoint can meet (a tag that must be
//     present: match, In, Exists, Prefix or CIDR on another key): a set of the
//     addresses of the valid workloads that match, each address checked with
//     its own `ip` (a selector mixing tags and an `ip` CIDR gives the matching
//     workloads' addresses within the CIDR);
//   - otherwise (requirements on other keys that an absent tag meets: NotIn,
//     DoesNotExist): a set of the CIDRs its `ip` requirements select, less the
//     addresses of the workloads within them that do not match.
//
// Prefix on `ip` (a text prefix of addresses) is refused: ErrPeerNotAddressable.

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ErrPeerNotAddressable: a peer selector that cannot be given as addresses.
var ErrPeerNotAddressable = errors.New("peer selector not expressible as addresses")

// PeerKind says how a peer selector is given to a kernel.
type PeerKind uint8

// Peer kinds.
const (
	// PeerCIDRs: static CIDRs (PeerPlan.CIDRs), whatever the inventory.
	PeerCIDRs PeerKind = iota + 1
	// PeerSet: an address set that follows the inventory.
	PeerSet
)

// PeerPlan is a compiled peer selector for address sets. It is immutable.
type PeerPlan struct {
	Kind  PeerKind
	CIDRs []string // PeerCIDRs: the CIDRs, sorted

	m *index.Matcher
	// external is the addresses an {ip: A} endpoint may match, when such an
	// endpoint can match at all (externalOK).
	external   []netip.Prefix
	externalOK bool
}

var everyAddress = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// PlanPeer compiles a peer selector for address sets.
func PlanPeer(sel resource.Selector) (*PeerPlan, error) {
	p := &PeerPlan{m: index.CompileSelector(&sel), externalOK: true}
	ext := everyAddress
	onlyIP := true
	for k, v := range sel.Match {
		if k != resource.IPTag {
			onlyIP = false
			p.externalOK = false
			continue
		}
		if v != "*" {
			ext = intersectPrefixes(ext, addressPoints([]string{v}))
		}
	}
	for _, e := range sel.Expressions {
		if e.Key != resource.IPTag {
			onlyIP = false
			if e.Operator != resource.OpNotIn && e.Operator != resource.OpDoesNotExist {
				p.externalOK = false
			}
			continue
		}
		switch e.Operator {
		case resource.OpIn:
			ext = intersectPrefixes(ext, addressPoints(e.Values))
		case resource.OpNotIn:
			for _, pt := range addressPoints(e.Values) {
				ext = subtractAddress(ext, pt.Addr())
			}
		case resource.OpCIDR:
			var ps []netip.Prefix
			for _, v := range e.Values {
				if c, err := resource.ParseCIDR(v); err == nil {
					ps = append(ps, c)
				}
			}
			ext = intersectPrefixes(ext, ps)
		case resource.OpExists:
		case resource.OpDoesNotExist:
			ext = nil
		default:
			return nil, fmt.Errorf("%w: %s on %s (a text prefix of addresses): use CIDR", ErrPeerNotAddressable, e.Operator, resource.IPTag)
		}
	}
	if p.externalOK {
		p.external = ext
	}
	if onlyIP && len(ext) > 0 {
		p.Kind = PeerCIDRs
		p.CIDRs = prefixStrings(ext)
		return p, nil
	}
	p.Kind = PeerSet
	return p, nil
}

// addressPoints are the values that are canonical IP addresses (the `ip` tag
// holds canonical text, so no other value can equal it), as full-length prefixes.
func addressPoints(values []string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range values {
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" || a.Unmap().String() != v {
			continue
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}

// intersectPrefixes is the addresses in both lists of prefixes.
func intersectPrefixes(a, b []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range a {
		for _, y := range b {
			switch {
			case x.Addr().BitLen() != y.Addr().BitLen():
			case x.Bits() <= y.Bits() && x.Contains(y.Addr()):
				out = append(out, y)
			case y.Bits() < x.Bits() && y.Contains(x.Addr()):
				out = append(out, x)
			}
		}
	}
	return normalizePrefixes(out)
}

// subtractAddress removes one address from a list of disjoint prefixes: the
// prefix holding it becomes the siblings along the path to it.
func subtractAddress(ps []netip.Prefix, a netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if !p.Contains(a) {
			out = append(out, p)
			continue
		}
		for bits := p.Bits(); bits < a.BitLen(); bits++ {
			half, _ := a.Prefix(bits + 1)
			out = append(out, sibling(half))
		}
	}
	return normalizePrefixes(out)
}

// sibling is the other half of p's parent prefix.
func sibling(p netip.Prefix) netip.Prefix {
	b := p.Addr().AsSlice()
	i := p.Bits() - 1
	b[i/8] ^= 0x80 >> (i % 8)
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, p.Bits())
}

// normalizePrefixes sorts prefixes and drops those another one covers.
func normalizePrefixes(ps []netip.Prefix) []netip.Prefix {
	sort.Slice(ps, func(i, j int) bool {
		if c := ps[i].Addr().Compare(ps[j].Addr()); c != 0 {
			return c < 0
		}
		return ps[i].Bits() < ps[j].Bits()
	})
	out := ps[:0]
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// prefixStrings renders prefixes: a full-length prefix as its address.
func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		if p.IsSingleIP() {
			out[i] = p.Addr().String()
		} else {
			out[i] = p.String()
		}
	}
	return out
}

// PeerMember is one workload's part in a set: its addresses that match (In),
// and, for a set that also holds addresses no workload holds, its addresses
// within them that do not match (Out: carved out of the set).
type PeerMember struct {
	In       []string
	Out      []string
	Identity uint64
}

func (p *PeerPlan) Member(e *WorkloadEntry) (PeerMember, bool) {
	if e.Err != "" || p.Kind != PeerSet {
		return PeerMember{}, false
	}
	var m PeerMember
	tags := make(resource.Tags, len(e.Workload.Tags)+1)
	for k, v := range e.Workload.Tags {
		tags[k] = v
	}
	for _, a := range e.Workload.Addresses {
		tags[resource.IPTag] = a
		if p.m.Matches(tags) {
			m.In = append(m.In, a)
		} else if p.externalOK && p.inExternal(a) {
			m.Out = append(m.Out, a)
		}
	}
	if len(m.In) == 0 && len(m.Out) == 0 {
		return PeerMember{}, false
	}
	m.Identity = e.ID
	return m, true
}

func (p *PeerPlan) inExternal(addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	for _, x := range p.external {
		if x.Contains(a) {
			return true
		}
	}
	return false
}

// Static reports whether the set's addresses are those its members hold
// (false: the set is CIDRs less the members' Out addresses; see Addresses).
func (p *PeerPlan) Static() bool { return !p.externalOK }

// Addresses returns the set's addresses given the Out addresses of its
// members, for a set that is not Static: the CIDRs its `ip` requirements
// select, less those addresses, as text sorted as text.
func (p *PeerPlan) Addresses(out []string) []string {
	ps := append([]netip.Prefix(nil), p.external...)
	for _, o := range out {
		if a, err := netip.ParseAddr(o); err == nil {
			ps = subtractAddress(ps, a)
		}
	}
	list := prefixStrings(ps)
	sort.Strings(list)
	return list
}

package resource

// The Workload decoder, and Kuma's Dataplane documents read as workloads
// (docs/workloads.md).

import (
	"fmt"
	"strconv"
)

// Limits of a workload.
const (
	MaxAddresses     = 64   // addresses of one workload
	MaxWorkloadPorts = 1024 // ports entries of one workload (Kuma inbounds)
)

func decodeWorkload(o *obj) *Workload {
	w := &Workload{Mesh: o.meshName(), Name: o.name("name", true)}
	w.Tags = workloadTags(o, "tags")
	if l, ok := o.list("addresses"); ok {
		w.Addresses = decodeAddresses(o, o.field("addresses"), l)
	}
	w.Principal = decodePrincipal(o, "principal")
	if l, ok := o.list("ports"); ok {
		if len(l) > MaxWorkloadPorts {
			o.errs.Add(o.field("ports"), fmt.Sprintf("has %d entries, over the limit of %d", len(l), MaxWorkloadPorts))
			l = nil
		}
		for i, v := range l {
			path := fmt.Sprintf("%s[%d]", o.field("ports"), i)
			m, ok := v.(map[string]any)
			if !ok {
				o.errs.Add(path, "must be an object")
				continue
			}
			po := newObj(o.errs, path, m)
			p := WorkloadPort{Port: decodePortNumber(po, "port", true)}
			p.Tags = workloadTags(po, "tags")
			po.finish()
			w.Ports = append(w.Ports, p)
		}
	}
	w.Meta = o.meta()
	return w
}

// workloadTags reads the tags of a workload or of one of its ports: no
// wildcards, no reserved keys.
func workloadTags(o *obj, key string) map[string]string {
	tags := o.stringMap(key, false)
	for k := range tags {
		if IsReservedTag(k) {
			o.errs.Add(o.field(key)+"["+strconv.Quote(k)+"]",
				fmt.Sprintf("%q is reserved: it is set from the address or principal a request gives", k))
		}
	}
	return tags
}

func decodeAddresses(o *obj, path string, l []any) []string {
	if len(l) > MaxAddresses {
		o.errs.Add(path, fmt.Sprintf("has %d addresses, over the limit of %d", len(l), MaxAddresses))
		return nil
	}
	out := make([]string, 0, len(l))
	seen := make(map[string]int, len(l))
	for i, v := range l {
		p := fmt.Sprintf("%s[%d]", path, i)
		s, ok := v.(string)
		if !ok {
			o.errs.Add(p, "must be an IP address as a string")
			continue
		}
		a, err := CanonicalAddress(s)
		if err != nil {
			o.errs.Add(p, err.Error())
			continue
		}
		if j, dup := seen[a]; dup {
			o.errs.Add(p, fmt.Sprintf("%s is also %s[%d]", a, path, j))
			continue
		}
		seen[a] = i
		out = append(out, a)
	}
	return out
}

func decodePrincipal(o *obj, key string) string {
	s := o.str(key)
	if s == "" {
		return ""
	}
	if err := CheckTagValue(s, false); err != nil {
		o.errs.addErr(o.field(key), err)
	}
	return s
}

func decodePortNumber(o *obj, key string, required bool) uint32 {
	v, ok := o.take(key)
	if !ok {
		if required {
			o.errs.Add(o.field(key), "is required: a port from 1 to 65535")
		}
		return 0
	}
	s, ok := scalarText(v)
	if _, isBool := v.(bool); ok && !isBool {
		if n, err := strconv.ParseUint(s, 10, 16); err == nil && n > 0 {
			return uint32(n)
		}
	}
	o.errs.Add(o.field(key), fmt.Sprintf("%v is not a port from 1 to 65535", v))
	return 0
}

// isDataplane reports whether a document is a Kuma Dataplane: `type:
// Dataplane` and no kind (an exception to "type without kind is a Policy").
func isDataplane(m map[string]any) bool {
	_, hasKind := m["kind"]
	t, _ := m["type"].(string)
	return !hasKind && t == "Dataplane"
}

// decodeDataplaneDoc decodes a Kuma Dataplane document (isDataplane).
func decodeDataplaneDoc(m map[string]any) (Resource, []FieldError) {
	var errs FieldErrors
	o := newObj(&errs, "", m)
	w := decodeDataplane(o)
	o.finish()
	return w, errs.errs
}

// decodeDataplane reads a Kuma Dataplane as a workload: networking.address →
// addresses (with each inbound's own address, when it gives another), each
// inbound → a ports entry keyed by its port with its tags, the workload's tags =
// the first inbound's tags (a gateway's tags for a gateway dataplane) plus
// kuma.io/name = the Dataplane's name. Outbounds, health, probes and the other
// fields Envoy needs are read and ignored; labels are ignored.
func decodeDataplane(o *obj) *Workload {
	o.str("type")
	o.take("labels")
	w := &Workload{Mesh: o.meshName(), Name: o.name("name", true)}
	no, ok := o.sub("networking")
	if !ok {
		o.errs.Add(o.field("networking"), "is required: a Dataplane has networking.address and inbounds")
		o.finish()
		return w
	}
	var addrs []any
	if a := no.str("address"); a != "" {
		addrs = append(addrs, a)
	} else {
		o.errs.Add(no.field("address"), "is required")
	}
	no.take("advertisedAddress")
	no.take("outbound")
	no.take("transparentProxying")
	no.take("admin")
	var gatewayTags map[string]string
	if go_, ok := no.sub("gateway"); ok {
		gatewayTags = workloadTags(go_, "tags")
		go_.str("type")
		go_.finish()
	}
	if l, ok := no.list("inbound"); ok {
		if len(l) > MaxWorkloadPorts {
			o.errs.Add(no.field("inbound"), fmt.Sprintf("has %d entries, over the limit of %d", len(l), MaxWorkloadPorts))
			l = nil
		}
		for i, v := range l {
			path := fmt.Sprintf("%s[%d]", no.field("inbound"), i)
			m, ok := v.(map[string]any)
			if !ok {
				o.errs.Add(path, "must be an object")
				continue
			}
			io := newObj(o.errs, path, m)
			p := WorkloadPort{Port: decodePortNumber(io, "port", true)}
			p.Tags = workloadTags(io, "tags")
			if a := io.str("address"); a != "" {
				addrs = append(addrs, a)
			}
			for _, k := range []string{"servicePort", "serviceAddress", "health", "serviceProbe", "state", "name"} {
				io.take(k)
			}
			io.finish()
			if i == 0 && gatewayTags == nil {
				w.Tags = p.Tags
			}
			w.Ports = append(w.Ports, p)
		}
	}
	no.finish()
	if gatewayTags != nil {
		w.Tags = gatewayTags
	}
	w.Addresses = uniqueAddresses(o, no.field("address"), addrs)
	tags := make(map[string]string, len(w.Tags)+1)
	for k, v := range w.Tags {
		tags[k] = v
	}
	if _, set := tags[NameTag]; !set && w.Name != "" {
		tags[NameTag] = w.Name
	}
	w.Tags = tags
	w.Meta = o.meta()
	return w
}

// uniqueAddresses reads a Dataplane's addresses, dropping repeats (an
// inbound's address is usually networking.address).
func uniqueAddresses(o *obj, path string, l []any) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range l {
		s, _ := v.(string)
		a, err := CanonicalAddress(s)
		if err != nil {
			o.errs.Add(path, err.Error())
			continue
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

type jsonWorkload struct {
	Kind             string             `json:"kind"`
	Mesh             string             `json:"mesh"`
	Name             string             `json:"name"`
	Tags             map[string]string  `json:"tags,omitempty"`
	Addresses        []string           `json:"addresses,omitempty"`
	Principal        string             `json:"principal,omitempty"`
	Ports            []jsonWorkloadPort `json:"ports,omitempty"`
	CreationTime     string             `json:"creationTime,omitempty"`
	ModificationTime string             `json:"modificationTime,omitempty"`
}

type jsonWorkloadPort struct {
	Port uint32            `json:"port"`
	Tags map[string]string `json:"tags,omitempty"`
}

func workloadDocument(w *Workload) jsonWorkload {
	j := jsonWorkload{Kind: "Workload", Mesh: w.Mesh, Name: w.Name, Tags: w.Tags, Addresses: w.Addresses,
		Principal: w.Principal, CreationTime: jsonTime(w.Meta.CreationTime), ModificationTime: jsonTime(w.Meta.ModificationTime)}
	for _, p := range w.Ports {
		j.Ports = append(j.Ports, jsonWorkloadPort(p))
	}
	return j
}

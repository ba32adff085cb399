package analysis

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// keyConds are the conditions the selectors of a partition test on one tag
// key: the values they name, the prefixes and the CIDRs.
type keyConds struct {
	named    map[string]int32 // each value named, by its code: 1, 2, ...
	prefixes []string
	cidrs    []netip.Prefix
}

// appendCode appends to buf the code of v as a class holds it: a value
// named by its own code; any other by 0 and, when the key has prefixes or
// CIDRs, the signature of v (of a length fixed per key), found in memo or
// computed and written there. Two values have one code iff every
// condition on the key treats them alike.
func (c *keyConds) appendCode(buf []byte, v string, memo *map[string]string) []byte {
	if n, ok := c.named[v]; ok {
		return binary.AppendUvarint(buf, uint64(n))
	}
	buf = append(buf, 0)
	if len(c.prefixes)+len(c.cidrs) == 0 {
		return buf
	}
	sig, ok := (*memo)[v]
	if !ok {
		sig = c.signature(v)
		if *memo == nil {
			*memo = map[string]string{}
		}
		(*memo)[v] = sig
	}
	return append(buf, sig...)
}

// signature is which prefixes and CIDRs v falls under, a bit each.
func (c *keyConds) signature(v string) string {
	buf := make([]byte, (len(c.prefixes)+len(c.cidrs)+7)/8)
	for i, p := range c.prefixes {
		if strings.HasPrefix(v, p) {
			buf[i/8] |= 1 << (i % 8)
		}
	}
	a, err := netip.ParseAddr(v)
	for j, p := range c.cidrs {
		if i := len(c.prefixes) + j; err == nil && p.Contains(a.Unmap()) {
			buf[i/8] |= 1 << (i % 8)
		}
	}
	return string(buf)
}

// The kinds of condition a selector tests on a key.
const (
	condKey    uint8 = iota // the key's presence alone (Exists, '*', ...)
	condNamed               // a value named (match, In, NotIn)
	condPrefix              // a Prefix
	condCIDR                // a CIDR (as written)
)

// eachCondition calls f with every condition s tests: its key, the kind
// and the value.
func eachCondition(s *resource.Selector, f func(key string, kind uint8, v string)) {
	if s == nil {
		return
	}
	for k, v := range s.Match {
		if v == "*" {
			f(k, condKey, "")
		} else {
			f(k, condNamed, v)
		}
	}
	for _, e := range s.Expressions {
		kind := condKey
		switch e.Operator {
		case resource.OpIn, resource.OpNotIn:
			kind = condNamed
		case resource.OpPrefix:
			kind = condPrefix
		case resource.OpCIDR:
			kind = condCIDR
		}
		f(e.Key, condKey, "")
		if kind != condKey {
			for _, v := range e.Values {
				f(e.Key, kind, v)
			}
		}
	}
}

// addCondition adds one condition to conds.
func addCondition(conds map[string]*keyConds, k string, kind uint8, v string) {
	c := condsFor(conds, k)
	switch kind {
	case condNamed:
		if _, ok := c.named[v]; !ok {
			c.named[v] = int32(len(c.named) + 1)
		}
	case condPrefix:
		c.prefixes = append(c.prefixes, v)
	case condCIDR:
		if p, err := resource.ParseCIDR(v); err == nil {
			c.cidrs = append(c.cidrs, p)
		}
	}
}

// covered reports whether conds already hold every condition s tests.
func covered(conds map[string]*keyConds, s *resource.Selector) bool {
	ok := true
	eachCondition(s, func(k string, kind uint8, v string) {
		c := conds[k]
		switch {
		case !ok:
		case c == nil:
			ok = false
		case kind == condNamed:
			_, ok = c.named[v]
		case kind == condPrefix:
			ok = slices.Contains(c.prefixes, v)
		case kind == condCIDR:
			if p, err := resource.ParseCIDR(v); err == nil {
				ok = slices.Contains(c.cidrs, p)
			}
		}
	})
	return ok
}

// eachSelector calls f with every selector the decisions of a partition
// read: the mesh's scopes' and, with policies, the type's policies'.
func eachSelector(p *engine.Partition, policies bool, f func(*resource.Selector)) {
	for _, sv := range p.Scopes() {
		for i := range sv.Doc.Selectors {
			f(&sv.Doc.Selectors[i])
		}
	}
	if policies {
		for pv := range p.Policies() {
			for _, s := range policySelectors(pv.Doc) {
				f(s)
			}
		}
	}
}

// conditionsOf collects, per tag key, the conditions of every selector the
// decisions of a partition read: the mesh's scopes and, with policies, the
// type's policies (sources, destinations, targetRefs, items).
func conditionsOf(p *engine.Partition, policies bool) map[string]*keyConds {
	out := map[string]*keyConds{}
	eachSelector(p, policies, func(s *resource.Selector) {
		eachCondition(s, func(k string, kind uint8, v string) { addCondition(out, k, kind, v) })
	})
	return out
}

// policySelectors lists every selector of a policy: sources, destinations,
// its targetRef and its items' targetRefs.
func policySelectors(p *resource.Policy) []*resource.Selector {
	var out []*resource.Selector
	for i := range p.Sources {
		out = append(out, &p.Sources[i])
	}
	for i := range p.Destinations {
		out = append(out, &p.Destinations[i])
	}
	if p.TargetRef != nil {
		out = append(out, resource.TargetSelector(*p.TargetRef))
	}
	for _, items := range [][]resource.Item{p.From, p.To} {
		for i := range items {
			out = append(out, resource.TargetSelector(items[i].TargetRef))
		}
	}
	return out
}

func condsFor(m map[string]*keyConds, k string) *keyConds {
	c, ok := m[k]
	if !ok {
		c = &keyConds{named: map[string]int32{}}
		m[k] = c
	}
	return c
}

// outsideKey reports whether the outside classes (outside.go) read the
// conditions on key k: those on the tags an endpoint outside the inventory
// resolves to.
func outsideKey(k string) bool {
	return k == resource.IPTag || k == resource.PrincipalTag || k == resource.ServiceTag
}

// outsideCond is one condition on an outside key, counted over the
// partition's selectors so that a carried base knows when the last
// selector testing it went.
type outsideCond struct {
	key  string
	kind uint8
	v    string
}

// outsideConds are the conditions on the outside keys held by counts, in
// a stable order.
func outsideConds(counts map[outsideCond]int32) map[string]*keyConds {
	out := map[string]*keyConds{}
	conds := make([]outsideCond, 0, len(counts))
	for c := range counts {
		conds = append(conds, c)
	}
	slices.SortFunc(conds, func(a, b outsideCond) int {
		if a.key != b.key {
			return strings.Compare(a.key, b.key)
		}
		if a.kind != b.kind {
			return int(a.kind) - int(b.kind)
		}
		return strings.Compare(a.v, b.v)
	})
	for _, c := range conds {
		addCondition(out, c.key, c.kind, c.v)
	}
	return out
}

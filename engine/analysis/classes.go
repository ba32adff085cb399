package analysis

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// keyConds are the conditions the selectors of a partition test on one tag
// key: the values they name, the prefixes and the CIDRs.
type keyConds struct {
	named    map[string]bool
	prefixes []string
	cidrs    []netip.Prefix
	// seen is the values interned while the partition's base was built:
	// frozen once built (a Bulk writes what it sees first to its own).
	seen keySeen
}

// keySeen is, for one key, the first value seen per signature (reps) and
// each value's canonical value (memo; kept only when the key has prefixes
// or CIDRs, as computing a signature is otherwise free).
type keySeen struct {
	reps map[string]string
	memo map[string]string
}

// canonical returns the value a class holds for v: v when a selector names
// it, else the first value seen with v's signature — in c.seen, or else in
// w, where a value seen first is written (w may be &c.seen while the base
// is built).
func (c *keyConds) canonical(v string, w *keySeen) string {
	if c.named[v] {
		return v
	}
	sig := ""
	split := len(c.prefixes)+len(c.cidrs) > 0
	if split {
		if out, ok := c.seen.memo[v]; ok {
			return out
		}
		if out, ok := w.memo[v]; ok {
			return out
		}
		sig = c.signature(v)
	}
	rep, ok := c.seen.reps[sig]
	if !ok {
		rep, ok = w.reps[sig]
	}
	if !ok {
		rep = v
		if w.reps == nil {
			w.reps = map[string]string{}
		}
		w.reps[sig] = v
	}
	if split {
		if w.memo == nil {
			w.memo = map[string]string{}
		}
		w.memo[v] = rep
	}
	return rep
}

// signature is which prefixes and CIDRs v falls under, as text.
func (c *keyConds) signature(v string) string {
	buf := make([]byte, 0, len(c.prefixes)+len(c.cidrs))
	for _, p := range c.prefixes {
		buf = append(buf, boolByte(strings.HasPrefix(v, p)))
	}
	a, err := netip.ParseAddr(v)
	for _, p := range c.cidrs {
		buf = append(buf, boolByte(err == nil && p.Contains(a.Unmap())))
	}
	return string(buf)
}

func boolByte(b bool) byte {
	if b {
		return '1'
	}
	return '0'
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
		c.named[v] = true
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
			ok = c.named[v]
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
		c = &keyConds{named: map[string]bool{}}
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

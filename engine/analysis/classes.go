package analysis

import (
	"net/netip"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

type keyConds struct {
	named    map[string]bool
	prefixes []string
	cidrs    []netip.Prefix
	reps     map[string]string // signature → the first value seen with it
	memo     map[string]string // value → its canonical value
}

// canonical returns the value a class holds for v.
func (c *keyConds) canonical(v string) string {
	if c.named[v] {
		return v
	}
	if out, ok := c.memo[v]; ok {
		return out
	}
	sig := c.signature(v)
	rep, ok := c.reps[sig]
	if !ok {
		rep = v
		c.reps[sig] = v
	}
	c.memo[v] = rep
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

// conditionsOf collects, per tag key, the conditions of every selector the
// decisions of a partition read: the mesh's scopes and, with policies, the
// type's policies (sources, destinations, targetRefs, items).
func conditionsOf(p *engine.Partition, policies bool) map[string]*keyConds {
	out := map[string]*keyConds{}
	add := func(s *resource.Selector) {
		if s == nil {
			return
		}
		for k, v := range s.Match {
			c := condsFor(out, k)
			if v != "*" {
				c.named[v] = true
			}
		}
		for _, e := range s.Expressions {
			c := condsFor(out, e.Key)
			switch e.Operator {
			case resource.OpIn, resource.OpNotIn:
				for _, v := range e.Values {
					c.named[v] = true
				}
			case resource.OpPrefix:
				c.prefixes = append(c.prefixes, e.Values...)
			case resource.OpCIDR:
				for _, v := range e.Values {
					if p, err := resource.ParseCIDR(v); err == nil {
						c.cidrs = append(c.cidrs, p)
					}
				}
			}
		}
	}
	for _, sv := range p.Scopes() {
		for i := range sv.Doc.Selectors {
			add(&sv.Doc.Selectors[i])
		}
	}
	if policies {
		for pv := range p.Policies() {
			for _, s := range policySelectors(pv.Doc) {
				add(s)
			}
		}
	}
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
		c = &keyConds{named: map[string]bool{}, reps: map[string]string{}, memo: map[string]string{}}
		m[k] = c
	}
	return c
}

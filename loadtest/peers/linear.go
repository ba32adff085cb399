package peers

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Linear is the obvious implementation: the rules in order in one slice, and a
// loop that checks each until one matches (under DenyOverrides: until a DENY
// matches, remembering the first matching ALLOW).
type Linear struct {
	rules   []Rule
	combine resource.Combine
	def     resource.Action
}

// NewLinear holds the program's rules in order.
func NewLinear(p *Program) *Linear {
	return &Linear{rules: p.Rules, combine: p.Combine, def: p.DefaultAction}
}

// Decide implements Decider.
func (l *Linear) Decide(req *engine.Request) (Outcome, error) {
	var allow *Rule
	for i := range l.rules {
		r := &l.rules[i]
		if !portsMatch(r.Ports, req.Protocol, req.Port) || !selects(&r.Src, req.Source) || !selects(&r.Dst, req.Destination) {
			continue
		}
		if l.combine == resource.FirstMatch || r.Action == resource.Deny {
			return Outcome{Action: r.Action, Policy: r.Policy}, nil
		}
		if allow == nil {
			allow = r
		}
	}
	if allow != nil {
		return Outcome{Action: allow.Action, Policy: allow.Policy}, nil
	}
	return Outcome{Action: l.def}, nil
}

// selects reports whether a workload's tags satisfy the selector (docs/selectors.md).
func selects(s *resource.Selector, tags resource.Tags) bool {
	for k, want := range s.Match {
		got, ok := tags[k]
		if !ok || want != "*" && got != want {
			return false
		}
	}
	for _, e := range s.Expressions {
		got, ok := tags[e.Key]
		switch e.Operator {
		case resource.OpIn:
			if !ok || !contains(e.Values, got) {
				return false
			}
		case resource.OpNotIn:
			if ok && contains(e.Values, got) {
				return false
			}
		case resource.OpExists:
			if !ok {
				return false
			}
		case resource.OpDoesNotExist:
			if ok {
				return false
			}
		default: // Translate refuses the other operators
			return false
		}
	}
	return true
}

func contains(values []string, v string) bool {
	for _, x := range values {
		if x == v {
			return true
		}
	}
	return false
}

// portsMatch reports whether a flow falls under the port entries (docs/selectors.md).
func portsMatch(entries []Ports, proto resource.Protocol, port uint32) bool {
	if len(entries) == 0 {
		return true
	}
	for _, e := range entries {
		if e.Protocol != resource.ProtocolAny && e.Protocol != proto {
			continue
		}
		if len(e.Ranges) == 0 || proto == resource.ICMP {
			return true
		}
		for _, r := range e.Ranges {
			if port >= r[0] && port <= r[1] {
				return true
			}
		}
	}
	return false
}

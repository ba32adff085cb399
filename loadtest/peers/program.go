// Package peers compares verdict's engine with the obvious alternatives on the
// same generated policy sets and flows: OPA (policies as JSON data under one
// generic Rego rule, and policies compiled to one Rego rule each), cedar-go and a
// linear scan in Go. It first checks that they all reach the same decisions, then
// measures them side by side (bench_test.go, cmd/compare).
//
// Every peer is built from a Program: the policy set's rules, already placed in
// verdict's order (docs/order.md). Placing them is pure data and is done once in
// Go; matching a flow against the rules always happens inside the peer.
//
// The module is separate from verdict's so that OPA and cedar-go never become
// dependencies of the main module.
package peers

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ErrNotTranslated is returned when a policy set uses a feature a translation
// does not cover (scopes, targetRef, Absolute rank, CIDR or Prefix expressions,
// other tie-breaks). A silent mistranslation would make the comparison
// meaningless, so the translation refuses instead.
var ErrNotTranslated = errors.New("feature not translated")

// Outcome is a peer's answer for a flow: the final action and the policy that
// decided it ("" when the mesh's default action did).
type Outcome struct {
	Action resource.Action
	Policy string
}

func (o Outcome) String() string {
	if o.Policy == "" {
		return o.Action.String() + " (default)"
	}
	return o.Action.String() + " by " + o.Policy
}

// Decider decides flows against the policy set it was built from. Decide must be
// safe to call repeatedly; it is not called concurrently.
type Decider interface {
	Decide(req *engine.Request) (Outcome, error)
}

// Rule is one (source selector, destination selector) pair of an S&D policy: the
// unit verdict orders and matches (docs/order.md).
type Rule struct {
	Order  int // position in verdict's order; Program.Rules[i].Order == i
	Policy string
	Action resource.Action
	Src    resource.Selector
	Dst    resource.Selector
	Ports  []Ports // none: all traffic
}

// Ports is one port entry with its ranges parsed.
type Ports struct {
	Protocol resource.Protocol // ProtocolAny: every protocol
	Ranges   [][2]uint32       // inclusive; none: every port
}

// Program is a policy set of one mesh and type, as the peers see it: its rules
// in verdict's order, how they combine and what a side with no match gets.
type Program struct {
	Rules         []Rule
	Combine       resource.Combine
	DefaultAction resource.Action
}

// Translate reads a generated set into a Program. It supports what the generator
// produces without scopes: unscoped S&D policies of one mesh and type with match
// entries ('*' included), In/NotIn/Exists/DoesNotExist expressions, ports,
// priorities and actions, under the Name tie-break. Anything else is
// ErrNotTranslated.
//
// With every rule attached to the mesh root, both sides of a flow see the same
// candidates and reach the same answer (docs/order.md), so a flow's outcome is
// the answer of the one rule list.
func Translate(set *policygen.Set) (*Program, error) {
	prog := &Program{DefaultAction: resource.Deny}
	type keyed struct {
		r            Rule
		prio         int32
		total, exact int
		item         int
	}
	var rules []keyed
	for _, res := range set.Resources {
		switch x := res.(type) {
		case *resource.Mesh:
			if (x.TieBreak != resource.TieBreakUnset && x.TieBreak != resource.TieBreakName) || x.Profile != resource.ProfileNone {
				return nil, fmt.Errorf("%w: tie-break %s", ErrNotTranslated, x.TieBreak)
			}
			if x.DefaultAction == resource.Allow {
				prog.DefaultAction = resource.Allow
			}
			if ts, ok := x.Types[set.Config.Type]; ok {
				prog.Combine = ts.Combine
				if ts.DefaultAction != resource.ActionUnset {
					prog.DefaultAction = ts.DefaultAction
				}
			}
		case *resource.Scope:
			return nil, fmt.Errorf("%w: scope %s", ErrNotTranslated, x.Name)
		case *resource.Policy:
			if x.Scope != "" || x.IsTargetRef() || x.Rank != resource.RankDefault {
				return nil, fmt.Errorf("%w: policy %s is scoped, targetRef or Absolute", ErrNotTranslated, x.Name)
			}
			ports, err := parsePorts(x.Ports)
			if err != nil {
				return nil, fmt.Errorf("policy %s: %w", x.Name, err)
			}
			action := x.Action
			if action == resource.ActionUnset {
				action = resource.Allow
			}
			for i, src := range x.Sources {
				se, sw, err := rank(src)
				if err != nil {
					return nil, fmt.Errorf("policy %s: %w", x.Name, err)
				}
				for j, dst := range x.Destinations {
					de, dw, err := rank(dst)
					if err != nil {
						return nil, fmt.Errorf("policy %s: %w", x.Name, err)
					}
					rules = append(rules, keyed{
						r:    Rule{Policy: x.Name, Action: action, Src: src, Dst: dst, Ports: ports},
						prio: x.Priority, total: se + sw + de + dw, exact: se + de,
						item: i*len(x.Destinations) + j,
					})
				}
			}
		}
	}
	// docs/order.md without scopes or Absolute rules: priority ascending, then
	// rank (total, then exact) descending, then name, then pair position.
	slices.SortFunc(rules, func(a, b keyed) int {
		return cmp.Or(
			cmp.Compare(a.prio, b.prio),
			cmp.Compare(b.total, a.total),
			cmp.Compare(b.exact, a.exact),
			strings.Compare(a.r.Policy, b.r.Policy),
			cmp.Compare(a.item, b.item),
		)
	})
	prog.Rules = make([]Rule, len(rules))
	for i := range rules {
		prog.Rules[i] = rules[i].r
		prog.Rules[i].Order = i
	}
	return prog, nil
}

// rank is a selector's specificity (docs/selectors.md): exact entries (concrete
// match values and one-value In expressions) and all others.
func rank(s resource.Selector) (exact, wildcard int, err error) {
	for _, v := range s.Match {
		if v == "*" {
			wildcard++
		} else {
			exact++
		}
	}
	for _, e := range s.Expressions {
		switch e.Operator {
		case resource.OpIn, resource.OpNotIn, resource.OpExists, resource.OpDoesNotExist:
		default:
			return 0, 0, fmt.Errorf("%w: operator %s", ErrNotTranslated, e.Operator)
		}
		if e.Operator == resource.OpIn && len(e.Values) == 1 {
			exact++
		} else {
			wildcard++
		}
	}
	return exact, wildcard, nil
}

// parsePorts parses "80,443,8000-8100". A range starting at 0 starts at 1: port 0
// means "not given" and never falls in a range (docs/selectors.md).
func parsePorts(entries []resource.PortEntry) ([]Ports, error) {
	var out []Ports
	for _, e := range entries {
		p := Ports{Protocol: e.Protocol}
		if e.Ports != "" {
			for part := range strings.SplitSeq(e.Ports, ",") {
				lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
				a, err := strconv.ParseUint(lo, 10, 16)
				if err != nil {
					return nil, fmt.Errorf("ports %q: %w", e.Ports, err)
				}
				b := a
				if isRange {
					if b, err = strconv.ParseUint(hi, 10, 16); err != nil {
						return nil, fmt.Errorf("ports %q: %w", e.Ports, err)
					}
				}
				p.Ranges = append(p.Ranges, [2]uint32{max(uint32(a), 1), uint32(b)})
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// ByName maps policy names to the order of their first rule; Outcome.Policy of a
// peer that reports every matching policy (cedar-go) is picked with it.
func (p *Program) ByName() map[string]int {
	m := make(map[string]int, len(p.Rules))
	for i := len(p.Rules) - 1; i >= 0; i-- {
		m[p.Rules[i].Policy] = i
	}
	return m
}

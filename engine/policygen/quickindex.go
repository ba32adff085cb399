package policygen

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// QuickIndex is the honest baseline the engine's benchmarks compare with: the
// inverted index anyone would write in two hours. Every (source, destination)
// selector pair of a policy is a rule, ranked in verdict's order (docs/order.md:
// priority, specificity, name, pair); each rule is filed in one posting list,
// under the exact term of its selectors that the fewest rules carry (a present
// term only when it has none); a decision probes
// the lists of the flow's tags, verifies each rule found (map lookups on the
// tags) and keeps the best rank, leaving a list once its ranks cannot improve on
// it. Under DenyOverrides it keeps the best DENY and the best ALLOW.
//
// It covers what the generator produces without scopes: S&D policies of one
// mesh and type, match entries and In/NotIn/Exists/DoesNotExist expressions,
// port entries; anything else is refused with an error.
type QuickIndex struct {
	lists   map[qterm][]int32
	always  []int32
	rules   []qrule
	deny    bool // DenyOverrides
	def     resource.Action
	mesh    string
	typ     string
	present map[string]bool // keys some selector needs present: their lists hold presence terms
}

type qterm struct {
	dst   bool
	key   string
	value string // "" with present
}

type qrule struct {
	policy   string
	action   resource.Action
	src, dst qselector
	ports    []qports
}

// qselector is a selector as slices: walking a map per check would be slow.
type qselector struct {
	exact   [][2]string
	present []string
	exprs   []resource.Expression
}

func compileQuick(s *resource.Selector) qselector {
	var q qselector
	for k, v := range s.Match {
		if v == "*" {
			q.present = append(q.present, k)
		} else {
			q.exact = append(q.exact, [2]string{k, v})
		}
	}
	q.exprs = s.Expressions
	return q
}

type qports struct {
	proto  resource.Protocol
	ranges [][2]uint32
}

// QuickOutcome is the baseline's answer: the final action and the deciding
// policy ("" for the default action).
type QuickOutcome struct {
	Action resource.Action
	Policy string
}

// NewQuickIndex builds the baseline for a generated set.
func NewQuickIndex(set *Set) (*QuickIndex, error) {
	type keyed struct {
		r                            qrule
		priority, total, exact, item int
		name                         string
		srcTerms, dstTerms           []qterm
	}
	q := &QuickIndex{lists: map[qterm][]int32{}, def: resource.Deny, mesh: set.Config.Mesh, typ: set.Config.Type}
	var all []keyed
	for _, res := range set.Resources {
		switch x := res.(type) {
		case *resource.Mesh:
			q.def = x.DefaultAction
			if q.def == resource.ActionUnset {
				q.def = resource.Deny
			}
			q.deny = x.Types[set.Config.Type].Combine == resource.DenyOverrides
			if (x.TieBreak != resource.TieBreakUnset && x.TieBreak != resource.TieBreakName) || x.Profile != resource.ProfileNone {
				return nil, errors.New("quick index: only the Name tie-break")
			}
			if x.Types[set.Config.Type].Select != resource.SelectUnset {
				return nil, errors.New("quick index: only the default select")
			}
		case *resource.Scope:
			continue
		case *resource.Policy:
			if x.Mode == resource.ModeAudit {
				return nil, fmt.Errorf("quick index: policy %s: no audit mode", x.Name)
			}
			if x.TargetRef != nil || x.Scope != "" || x.Rank == resource.RankAbsolute {
				return nil, fmt.Errorf("quick index: policy %s: only unscoped S&D policies", x.Name)
			}
			ports, err := quickPorts(x.Ports)
			if err != nil {
				return nil, fmt.Errorf("quick index: policy %s: %w", x.Name, err)
			}
			action := x.Action
			if action == resource.ActionUnset {
				action = resource.Allow
			}
			for i := range x.Sources {
				for j := range x.Destinations {
					se, sw, st, err := quickSelector(&x.Sources[i], false)
					if err != nil {
						return nil, fmt.Errorf("quick index: policy %s: %w", x.Name, err)
					}
					de, dw, dt, err := quickSelector(&x.Destinations[j], true)
					if err != nil {
						return nil, fmt.Errorf("quick index: policy %s: %w", x.Name, err)
					}
					all = append(all, keyed{
						r: qrule{policy: x.Name, action: action, src: compileQuick(&x.Sources[i]),
							dst: compileQuick(&x.Destinations[j]), ports: ports},
						priority: int(x.Priority), total: se + sw + de + dw, exact: se + de,
						item: i*len(x.Destinations) + j, name: x.Name, srcTerms: st, dstTerms: dt,
					})
				}
			}
		default:
			return nil, fmt.Errorf("quick index: %T not covered", res)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := &all[i], &all[j]
		switch {
		case a.priority != b.priority:
			return a.priority < b.priority
		case a.total != b.total:
			return a.total > b.total
		case a.exact != b.exact:
			return a.exact > b.exact
		case a.name != b.name:
			return a.name < b.name
		}
		return a.item < b.item
	})
	// How many rules carry each term: a rule goes under its rarest one.
	df := map[qterm]int{}
	for i := range all {
		for _, t := range append(all[i].srcTerms, all[i].dstTerms...) {
			df[t]++
		}
	}
	q.present = map[string]bool{}
	q.rules = make([]qrule, len(all))
	for i := range all {
		q.rules[i] = all[i].r
		// Exact terms first (a present term's list is probed by every flow
		// with the key), the rarest among them.
		best, bestN := qterm{}, -1
		for _, t := range append(all[i].srcTerms, all[i].dstTerms...) {
			if n := df[t]; bestN < 0 || (t.value != "") != (best.value != "") && t.value != "" ||
				(t.value != "") == (best.value != "") && n < bestN {
				best, bestN = t, n
			}
		}
		if bestN < 0 {
			q.always = append(q.always, int32(i))
			continue
		}
		if best.value == "" {
			q.present[best.key] = true
		}
		q.lists[best] = append(q.lists[best], int32(i))
	}
	return q, nil
}

// quickSelector returns a selector's rank (exact, wildcard entries) and the
// terms it requires: exact tags, and '*' or Exists as a present term.
func quickSelector(s *resource.Selector, dst bool) (exact, wild int, terms []qterm, err error) {
	for k, v := range s.Match {
		if v == "*" {
			wild++
			terms = append(terms, qterm{dst: dst, key: k})
			continue
		}
		exact++
		terms = append(terms, qterm{dst: dst, key: k, value: v})
	}
	for _, e := range s.Expressions {
		switch e.Operator {
		case resource.OpIn:
			if len(e.Values) == 1 {
				exact++
				terms = append(terms, qterm{dst: dst, key: e.Key, value: e.Values[0]})
				continue
			}
			terms = append(terms, qterm{dst: dst, key: e.Key})
		case resource.OpExists:
			terms = append(terms, qterm{dst: dst, key: e.Key})
		case resource.OpNotIn, resource.OpDoesNotExist:
		default:
			return 0, 0, nil, fmt.Errorf("operator %s not covered", e.Operator)
		}
		wild++
	}
	sort.Slice(terms, func(i, j int) bool { return terms[i].key+"="+terms[i].value < terms[j].key+"="+terms[j].value })
	return exact, wild, terms, nil
}

func quickPorts(entries []resource.PortEntry) ([]qports, error) {
	var out []qports
	for _, e := range entries {
		p := qports{proto: e.Protocol}
		if e.Ports != "" {
			for _, part := range strings.Split(e.Ports, ",") {
				lo, hi, found := strings.Cut(part, "-")
				if !found {
					hi = lo
				}
				a, err1 := strconv.ParseUint(lo, 10, 16)
				b, err2 := strconv.ParseUint(hi, 10, 16)
				if err1 != nil || err2 != nil {
					return nil, fmt.Errorf("ports %q", e.Ports)
				}
				p.ranges = append(p.ranges, [2]uint32{uint32(a), uint32(b)})
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Decide answers a flow of the set's mesh and type.
func (q *QuickIndex) Decide(req *engine.Request) QuickOutcome {
	best, deny := int32(len(q.rules)), int32(len(q.rules))
	visit := func(l []int32) {
		for _, i := range l {
			if q.deny {
				if i >= deny {
					return
				}
			} else if i >= best {
				return
			}
			r := &q.rules[i]
			if !q.matches(r, req) {
				continue
			}
			if r.action == resource.Deny && i < deny {
				deny = i
			}
			if i < best {
				best = i
			}
		}
	}
	visit(q.always)
	for _, side := range [2]struct {
		dst  bool
		tags resource.Tags
	}{{false, req.Source}, {true, req.Destination}} {
		for k, v := range side.tags {
			visit(q.lists[qterm{dst: side.dst, key: k, value: v}])
			if q.present[k] {
				visit(q.lists[qterm{dst: side.dst, key: k}])
			}
		}
	}
	if q.deny && deny < int32(len(q.rules)) {
		best = deny
	}
	if best == int32(len(q.rules)) {
		return QuickOutcome{Action: q.def}
	}
	return QuickOutcome{Action: q.rules[best].action, Policy: q.rules[best].policy}
}

// Matching counts the policies with a rule that matches the flow, ports
// included: a linear scan of every rule, for the benchmarks' report of how
// dense a set is.
func (q *QuickIndex) Matching(req *engine.Request) int {
	seen := map[string]bool{}
	for i := range q.rules {
		if r := &q.rules[i]; !seen[r.policy] && q.matches(r, req) {
			seen[r.policy] = true
		}
	}
	return len(seen)
}

func (q *QuickIndex) matches(r *qrule, req *engine.Request) bool {
	if len(r.ports) > 0 {
		ok := false
		for _, p := range r.ports {
			if quickPortMatch(&p, req.Protocol, req.Port) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return quickSelects(&r.src, req.Source) && quickSelects(&r.dst, req.Destination)
}

func quickPortMatch(p *qports, proto resource.Protocol, port uint32) bool {
	if p.proto != resource.ProtocolAny && p.proto != proto {
		return false
	}
	if len(p.ranges) == 0 || proto == resource.ICMP {
		return true
	}
	for _, r := range p.ranges {
		if port >= r[0] && port <= r[1] && port != 0 {
			return true
		}
	}
	return false
}

func quickSelects(s *qselector, tags resource.Tags) bool {
	for _, kv := range s.exact {
		if got, ok := tags[kv[0]]; !ok || got != kv[1] {
			return false
		}
	}
	for _, k := range s.present {
		if _, ok := tags[k]; !ok {
			return false
		}
	}
	for _, e := range s.exprs {
		got, ok := tags[e.Key]
		in := false
		for _, v := range e.Values {
			if ok && v == got {
				in = true
			}
		}
		switch {
		case e.Operator == resource.OpIn && !in,
			e.Operator == resource.OpNotIn && in,
			e.Operator == resource.OpExists && !ok,
			e.Operator == resource.OpDoesNotExist && ok:
			return false
		}
	}
	return true
}

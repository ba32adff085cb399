package engine

import (
	"fmt"
	"reflect"
	"sort"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// RuleView is one rule of a workload's ordered rule list (WatchRules): what a
// firewall agent needs to enforce it on its side.
type RuleView struct {
	Policy   string
	Scope    string
	Phase    string // Absolute, Default, CatchAll
	Priority int32
	Rule     string              // "sources[0]/destinations[1]", "from[2]", "catchAll"
	Peer     []resource.Selector // the other end's selector; empty: any workload
	Ports    []resource.PortEntry
	Action   resource.Action
	// Audit: the rule decides only the shadow decision; an agent may log
	// what it matches, never enforce it (docs/audit.md).
	Audit bool
}

// SideRules are the rules of one side of a workload, in decision order, and what
// happens to a flow none of them matches.
type SideRules struct {
	Rules []RuleView
	// Fallback is the action for a flow no rule matches, with its reason
	// (DEFAULT_ACTION, UNENFORCED or NOT_APPLICABLE).
	Fallback       resource.Action
	FallbackReason Reason
	// Combine is the type's combining algorithm; under DenyOverrides any
	// matching DENY wins whatever its position.
	Combine resource.Combine
}

// RuleSet is a workload's rules: inbound (flows to it) and outbound (flows from it).
type RuleSet struct {
	Inbound  SideRules
	Outbound SideRules
}

// Equal reports whether two rule sets would make an agent enforce the same thing.
func (a RuleSet) Equal(b RuleSet) bool { return reflect.DeepEqual(a, b) }

// RulesFor returns the ordered rules that concern a workload (docs/api.md,
// WatchRules): on the outbound side, the candidate rules whose source selector
// matches it; on the inbound side, those whose destination selector matches it;
// catch-alls last. A side whose most specific scope is not enforced, or that is
// not applicable, has no rules and says so in its fallback.
func (s *Snapshot) RulesFor(mesh, typ string, workload resource.Tags) (RuleSet, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(mesh)
	if s.closedByType(mesh, ms, typ) != nil {
		set := settingsOf(nil)
		if ok {
			set = ms.settings
		}
		return closedRules(set.forType(typ)), nil
	}
	if !ok {
		return RuleSet{}, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
	}
	if err := ms.checkType(typ); err != nil {
		return RuleSet{}, err
	}
	ts, _ := ms.types.Get(typ)
	set := ms.settings.forType(typ)
	f := &index.Flow{Src: workload, Dst: workload}
	sc := &scratch{}
	sc.reset(ms.scopes.size())
	if ms.scopes.size() > 0 {
		sc.computeMembers(ms.scopes, 0, workload)
		sc.computeMembers(ms.scopes, 1, workload)
	}
	var out RuleSet
	for side := 0; side < 2; side++ {
		sr := SideRules{Combine: set.combine}
		switch {
		case ts.notApplicable(side, false) || set.perDestination && side == 0:
			sr.Fallback, sr.FallbackReason = resource.Allow, ReasonNotApplicable
		case ms.unenforcedScope(sc, side, false):
			sr.Fallback, sr.FallbackReason = set.unenforcedAction, ReasonUnenforced
		default:
			cands := ms.rulesOf(ts, typ, workload, sc, side)
			if set.perDestination {
				cands = onlyChosen(cands, ms.chooseForDestination(ts, workload, sc, false), ms.chooseForDestination(ts, workload, sc, true))
			}
			for _, r := range cands {
				peer := r.Dst
				if side == 1 {
					peer = r.Src
				}
				v := RuleView{Policy: r.PolicyName(), Scope: ms.scopeName(r.Scope), Phase: index.PhaseNames[r.Key.Phase],
					Priority: r.Key.Priority, Rule: r.ID, Ports: r.Ports, Action: r.Action, Audit: r.Audit}
				if peer != nil && (len(peer.Exact)+len(peer.Present)+len(peer.Exprs) > 0) {
					v.Peer = []resource.Selector{*peer.Sel}
				}
				sr.Rules = append(sr.Rules, v)
			}
			sr.Fallback, sr.FallbackReason = set.defaultAction, ReasonDefaultAction
			if !ms.hasCandidate(ts, f, sc, side, false) && ms.catchAll(typ, sc, side, false) == nil {
				sr.Fallback, sr.FallbackReason = set.unenforcedAction, ReasonUnenforced
			}
		}
		if side == 0 {
			out.Outbound = sr
		} else {
			out.Inbound = sr
		}
	}
	return out, nil
}

// rulesOf returns, in order, the rules that are candidates on a side of a
// workload and whose own end (the source for outbound, the destination for
// inbound) selects it, catch-alls and audit rules included: one pass over the
// type's rules, rejecting on the workload's own selector first, then a sort of
// the few kept.
func (ms *meshState) rulesOf(ts *typeState, typ string, workload resource.Tags, sc *scratch, side int) []*index.Rule {
	var out []*index.Rule
	keep := func(r *index.Rule) {
		own := r.Src
		if side == 1 {
			own = r.Dst
		}
		if r.Sides&index.SideBits[side] == 0 || !own.Matches(workload) || !sc.IsMember(side, r.Scope) {
			return
		}
		out = append(out, r)
	}
	if ts != nil {
		ts.rules.Each(keep)
		ts.audit.rules.Each(keep)
	}
	for _, c := range ms.scopes.catchAlls[typ] {
		if sc.IsMember(side, c.Scope) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.Less(&out[j].Key) })
	return out
}

package engine

import (
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// select: PerDestination (docs/order.md): one policy per inbound, as Kong
// Mesh applies TrafficPermission ("Only one policy of a given type is matched
// to a particular inbound", seed 001) and Kuma's legacy code does
// (SelectInboundConnectionPolicy). The inbound side first chooses the single
// most specific policy by its destination selector alone — ignoring phase,
// scope and priority, ties by the mesh's tieBreak — then that policy's sources
// and ports must match the flow, else the side's fallback decides (its
// catch-all, else defaultAction). The outbound side is not applicable.
//
// Cost: the choice is indexed (index.DestIndex): a probe reads the claim lists
// of the destination's tags, each sorted by the choice's order, and stops in
// each at the first claim that holds — about the cost of the destination half
// of a decision's walk, not O(policies). index.Claim's order is the choice's;
// export_test.go keeps the scan by definition the tests compare it with.

// chooseForDestination returns the policy chosen for an inbound of the
// workload dst, or nil when no policy's destination selector matches it. A
// policy is considered only where it is attached: the destination must be a
// member of its scope. The enforced view leaves audit policies out.
func (ms *meshState) chooseForDestination(ts *typeState, dst resource.Tags, sc *scratch, shadow bool) *compiledPolicy {
	if ts == nil || ts.viewCounts(shadow).policies == 0 {
		return nil
	}
	cp, _ := ts.dest.Best(dst, &sc.Scratch, shadow)
	return cp
}

// firstRuleOf returns the first rule of a policy, in order, that is a
// candidate on the inbound side and matches the flow (sources, destination and
// ports); the enforced view leaves audit rules out.
func firstRuleOf(cp *compiledPolicy, f *index.Flow, sc *scratch, shadow bool) *index.Rule {
	var first *index.Rule
	for _, r := range cp.rules {
		if r.Sides&index.SideIn == 0 || r.Audit && !shadow || !sc.IsMember(1, r.Scope) || !r.MatchesFlow(f) {
			continue
		}
		if first == nil || r.Key.Less(&first.Key) {
			first = r
		}
	}
	return first
}

// decidePerDestination answers the inbound side of a PerDestination type.
func (ms *meshState) decidePerDestination(ts *typeState, typ string, set typeSettings, f *index.Flow, sc *scratch, shadow bool) SideDecision {
	var r *index.Rule
	if cp := ms.chooseForDestination(ts, f.Dst, sc, shadow); cp != nil {
		r = firstRuleOf(cp, f, sc, shadow)
	}
	return ms.sideResult(ts, typ, set, f, sc, 1, r, shadow)
}

// onlyChosen keeps, of a workload's inbound rules, those of the policy chosen
// for it and the catch-alls (WatchRules under PerDestination); of the audit
// rules, those of the policy the shadow decision chooses.
func onlyChosen(rules []*index.Rule, chosen, shadowChosen *compiledPolicy) []*index.Rule {
	out := rules[:0]
	for _, r := range rules {
		c := chosen
		if r.Audit {
			c = shadowChosen
		}
		if r.Policy == nil || c != nil && r.Policy == c.p {
			out = append(out, r)
		}
	}
	return out
}

func chosenText(cp *compiledPolicy) string {
	if cp == nil {
		return "no policy"
	}
	return "policy " + cp.p.Name + " (the most specific by its destination selector)"
}

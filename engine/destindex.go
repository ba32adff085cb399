package engine

import (
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// A PerDestination type's choice is indexed (index.DestIndex): each valid
// policy claims the inbounds its destination selectors match, and a probe
// finds the most specific claim that holds for a destination.

// destIndex is a partition's claims; nil when the type is not PerDestination
// or no policy of it has a claim.
type destIndex = index.DestIndex[*compiledPolicy]

// destClaims returns a compiled policy's claims, under the tie-break tb.
func destClaims(cp *compiledPolicy, tb resource.TieBreak, out []index.Claim[*compiledPolicy]) []index.Claim[*compiledPolicy] {
	var k index.OrderKey
	ruleTieBreak(&k, cp.p, tb)
	start := len(out)
	mk := func(total, exact int16, dst *index.Matcher) index.Claim[*compiledPolicy] {
		return index.Claim[*compiledPolicy]{Total: total, Exact: exact, Item: int32(len(out) - start), Tb1: k.Tb1, Tb2: k.Tb2,
			Scope: cp.scopeOrd(), Name: cp.p.Name, Policy: cp, Dst: dst}
	}
	if cp.p.TargetRef != nil {
		// the top-level targetRef selects the destination of from items
		for _, a := range cp.attach {
			if a.Sides == index.SideIn {
				out = append(out, mk(a.Key.Total, 0, a.Dst))
			}
		}
		return out
	}
	// S&D rules are sources × destinations, source-major, and the
	// destination matchers are shared: the first row holds each once.
	for i, r := range cp.rules {
		if i > 0 && r.Dst == cp.rules[0].Dst {
			break
		}
		out = append(out, mk(r.Dst.Rank.Total(), r.Dst.Rank.Exact, r.Dst))
	}
	return out
}

// updateDest returns the destination index of a partition of m's type typ
// after the policies removed left it and added entered it (invalid ones are
// in neither index and are skipped); d is not changed.
func updateDest(d *destIndex, m *meshState, typ string, removed, added []*compiledPolicy) *destIndex {
	if !m.settings.forType(typ).perDestination {
		return nil
	}
	var rm, add [2][]index.Claim[*compiledPolicy]
	for _, cp := range removed {
		if cp.err == "" {
			i := auditIdx(cp.audit())
			rm[i] = destClaims(cp, m.settings.tieBreakFor(typ, cp.p.TargetRef != nil), rm[i])
		}
	}
	for _, cp := range added {
		if cp.err == "" {
			i := auditIdx(cp.audit())
			add[i] = destClaims(cp, m.settings.tieBreakFor(typ, cp.p.TargetRef != nil), add[i])
		}
	}
	return d.Update(rm, add)
}

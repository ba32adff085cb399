package engine

// The destination index of a PerDestination type (perdest.go): the inbound
// side's choice — the policy most specific by its destination selector alone —
// as a single-end query. Every policy of such a type has claims, one per
// destination selector (S&D) or one for its targetRef when it has from items;
// a claim is a pseudo-rule whose key is the choice's order (destChoice.better:
// rank total desc, exact desc, then the mesh's tieBreak keys and the name) and
// whose dst is the selector. Claims are filed in rule indexes of the
// destination end only (index.go), the enforced policies' and the audit
// ones' apart, so a probe reads the lists of the destination's tags and stops
// in each at the first claim that matches and is attached (the destination a
// member of the policy's scope), or as soon as the list's claims come after
// the best one found. Updates are those of the rule index: O(change).

// destIndex is a partition's claims: views[0] of its enforced policies,
// views[1] of its audit ones. nil: the type is not PerDestination, or no
// policy of it has a claim.
type destIndex struct {
	views [2]*ruleIndex
}

// destClaims returns a compiled policy's claims, under the mesh's tie-break.
func destClaims(cp *compiledPolicy, tb TieBreak) []*rule {
	mk := func(total, exact int16, item int32, dst *matcher) *rule {
		k := orderKey{total: total, exact: exact, item: item}
		ruleTieBreak(&k, cp.p, tb)
		// action Allow: every claim is filed in the ALLOW lists
		return &rule{key: k, policy: cp.p, dst: dst, action: Allow, sides: sideIn, scope: cp.scopeOrd(), id: "claim", audit: cp.audit}
	}
	var out []*rule
	if cp.p.TargetRef != nil {
		// the top-level targetRef selects the destination of from items
		for _, a := range cp.attach {
			if a.sides == sideIn {
				out = append(out, mk(a.key.total, 0, int32(len(out)), a.dst))
			}
		}
		return out
	}
	// S&D rules are sources × destinations, source-major: the destination
	// matchers are shared, so the first row holds each once.
	seen := map[*matcher]bool{}
	for _, r := range cp.rules {
		if r.dst == nil || seen[r.dst] {
			continue
		}
		seen[r.dst] = true
		rk := r.dst.rank
		out = append(out, mk(rk.total(), rk.exact, int32(len(out)), r.dst))
	}
	return out
}

// update returns the index without the removed claims and with the added
// ones (per view); d is not changed.
func (d *destIndex) update(removed, added [2][]*rule) *destIndex {
	if d == nil {
		if len(added[0]) == 0 && len(added[1]) == 0 {
			return nil
		}
		d = &destIndex{views: [2]*ruleIndex{newIndex(endDst), newIndex(endDst)}}
	}
	out := &destIndex{}
	for i := range out.views {
		out.views[i] = d.views[i].update(removed[i], added[i])
	}
	return out
}

// best returns the first claim, in the choice's order, that the destination
// dst matches and is a member of the scope of (sc: the inbound side's
// memberships), among the enforced claims and in the shadow view the audit
// ones too; nil when none.
func (d *destIndex) best(dst Tags, sc *scratch, shadow bool) *rule {
	if d == nil {
		return nil
	}
	var best *rule
	var bestOrd uint64
	for i, ix := range d.views {
		if i == 1 && !shadow {
			break
		}
		if ix.size == 0 {
			continue
		}
		for cl := range ix.always {
			best, bestOrd = scanClaims(ix.always[cl], dst, sc, best, bestOrd)
		}
		if ix.keys.Len() == 0 {
			continue
		}
		for k, v := range dst {
			tk := termKey{endDst, k}
			kp, ok := ix.keys.GetHashed(tk, termKeyHash(tk))
			if !ok {
				continue
			}
			for cl := range kp.presence.lists {
				best, bestOrd = scanClaims(kp.presence.lists[cl], dst, sc, best, bestOrd)
			}
			if kp.exact.Len() > 0 {
				if p, ok := kp.exact.Get(v); ok {
					for cl := range p.lists {
						best, bestOrd = scanClaims(p.lists[cl], dst, sc, best, bestOrd)
					}
				}
			}
		}
	}
	return best
}

// scanClaims returns the first claim of l before best (ord: its order
// prefix) that holds for the destination, else best.
func scanClaims(l plist, dst Tags, sc *scratch, best *rule, bestOrd uint64) (*rule, uint64) {
	for i := range l {
		e := &l[i]
		if best != nil && !e.before(best, bestOrd) {
			break // this list's claims all come after the best one
		}
		if sc.isMember(1, e.r.scope) && e.r.dst.matches(dst) {
			return e.r, e.ord
		}
	}
	return best, bestOrd
}

package engine

// PerDestinationChoices returns, for the destination of a tag-form request,
// the policy PerDestination chooses in the enforced view ([0]) and the shadow
// view ([1]): as the destination index answers (got) and as a scan over every
// policy of the type answers (want: the choice's definition, the code before
// the index). "" means no policy.
func PerDestinationChoices(s *Snapshot, req *Request) (got, want [2]string) {
	ms, ok := s.meshes.Get(req.Mesh)
	if !ok {
		return got, want
	}
	ts, _ := ms.types.Get(req.Type)
	sc := &scratch{}
	sc.reset(ms.scopes.size())
	if ms.scopes.size() > 0 {
		sc.computeMembers(ms.scopes, 1, req.Destination)
	}
	name := func(cp *compiledPolicy) string {
		if cp == nil {
			return ""
		}
		return cp.p.Name
	}
	for view, shadow := range []bool{false, true} {
		got[view] = name(ms.chooseForDestination(ts, req.Destination, sc, shadow))
		want[view] = name(ms.chooseByScan(ts, req.Destination, sc, shadow))
	}
	return got, want
}

// destChoice is a policy's claim on an inbound: the rank of its best
// destination selector that matches, then the tie-break.
type destChoice struct {
	cp  *compiledPolicy
	key orderKey // total, exact, tb1, tb2, name
}

func (a *destChoice) better(b *destChoice) bool {
	if b.cp == nil {
		return true
	}
	if a.key.total != b.key.total {
		return a.key.total > b.key.total
	}
	if a.key.exact != b.key.exact {
		return a.key.exact > b.key.exact
	}
	if a.key.tb1 != b.key.tb1 {
		return a.key.tb1 < b.key.tb1
	}
	if a.key.tb2 != b.key.tb2 {
		return a.key.tb2 < b.key.tb2
	}
	return a.key.name < b.key.name
}

// chooseByScan is chooseForDestination by its definition: every valid
// policy of the type, the best by destChoice.better.
func (ms *meshState) chooseByScan(ts *typeState, dst Tags, sc *scratch, shadow bool) *compiledPolicy {
	if ts == nil {
		return nil
	}
	var best destChoice
	ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
		if cp.err != "" || cp.audit && !shadow || !sc.isMember(1, cp.scopeOrd()) {
			return true
		}
		c := destChoice{cp: cp}
		found := false
		if cp.p.TargetRef != nil {
			for _, a := range cp.attach {
				if a.sides == sideIn && a.dst.matches(dst) {
					c.key.total, found = a.key.total, true
				}
			}
		} else {
			for _, r := range cp.rules {
				if !r.dst.matches(dst) {
					continue
				}
				rk := r.dst.rank
				if !found || rk.total() > c.key.total || rk.total() == c.key.total && rk.exact > c.key.exact {
					c.key.total, c.key.exact = rk.total(), rk.exact
				}
				found = true
			}
		}
		if !found {
			return true
		}
		ruleTieBreak(&c.key, cp.p, ms.settings.tieBreak)
		if c.better(&best) {
			best = c
		}
		return true
	})
	return best.cp
}

// Procedures returns req decided uncached by each decision procedure in turn:
// the posting lists, then the bitmaps (decide.go, scanClass), so that the
// differential tests hold both to the reference whatever a flow would choose.
func Procedures(req Request) []Request {
	req.NoCache = true
	lists, bits := req, req
	lists.procedure, bits.procedure = procLists, procBits
	return []Request{lists, bits}
}

// BitBlocks returns how many bitmap blocks the enforced rules of a mesh's type
// are cut into, per action class.
func BitBlocks(s *Snapshot, mesh, typ string) [2]int {
	ms, ok := s.meshes.Get(mesh)
	if !ok {
		return [2]int{}
	}
	ts, ok := ms.types.Get(typ)
	if !ok || ts.rules.bits == nil {
		return [2]int{}
	}
	return [2]int{len(ts.rules.bits.classes[0]), len(ts.rules.bits.classes[1])}
}

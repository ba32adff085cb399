package engine

import (
	"fmt"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

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
	key index.OrderKey // total, exact, tb1, tb2, name
}

func (a *destChoice) better(b *destChoice) bool {
	if b.cp == nil {
		return true
	}
	if a.key.Total != b.key.Total {
		return a.key.Total > b.key.Total
	}
	if a.key.Exact != b.key.Exact {
		return a.key.Exact > b.key.Exact
	}
	if a.key.Tb1 != b.key.Tb1 {
		return a.key.Tb1 < b.key.Tb1
	}
	if a.key.Tb2 != b.key.Tb2 {
		return a.key.Tb2 < b.key.Tb2
	}
	return a.key.Name < b.key.Name
}

// chooseByScan is chooseForDestination by its definition: every valid
// policy of the type, the best by destChoice.better.
func (ms *meshState) chooseByScan(ts *typeState, dst resource.Tags, sc *scratch, shadow bool) *compiledPolicy {
	if ts == nil {
		return nil
	}
	var best destChoice
	ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
		if cp.err != "" || cp.audit() && !shadow || !sc.IsMember(1, cp.scopeOrd()) {
			return true
		}
		c := destChoice{cp: cp}
		found := false
		if cp.p.TargetRef != nil {
			for _, a := range cp.attach {
				if a.Sides == index.SideIn && a.Dst.Matches(dst) {
					c.key.Total, found = a.Key.Total, true
				}
			}
		} else {
			for _, r := range cp.rules {
				if !r.Dst.Matches(dst) {
					continue
				}
				rk := r.Dst.Rank
				if !found || rk.Total() > c.key.Total || rk.Total() == c.key.Total && rk.Exact > c.key.Exact {
					c.key.Total, c.key.Exact = rk.Total(), rk.Exact
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
	lists.procedure, bits.procedure = index.ProcLists, index.ProcBits
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
	if !ok {
		return [2]int{}
	}
	return ts.rules.BlockCounts()
}

// CheckBitmaps holds the bitmaps of every index of s to the rules the index
// files: per class, the blocks' slots in order (free ones too), every rule
// held once, and per held slot and dimension exactly the bits its terms ask
// (a rule verified whole, resid, may have more candidates, never fewer); no
// bit past the slots. It returns the first difference.
func CheckBitmaps(s *Snapshot) error {
	return checkRuleIndexes(s, func(ix *index.Index) bool { return ix.Bits != nil }, index.CheckBits)
}

// checkRuleIndexes runs check on each rule index of both ends of s (the
// policies' and the audit's) that keep selects, and returns the first error,
// named by its mesh and type.
func checkRuleIndexes(s *Snapshot, keep func(*index.Index) bool, check func(*index.Index) error) error {
	var err error
	s.meshes.Range(func(mesh string, ms *meshState) bool {
		ms.types.Range(func(typ string, ts *typeState) bool {
			for _, ix := range []*index.Index{ts.rules, ts.audit.rules} {
				if ix == nil || !keep(ix) {
					continue
				}
				if err = check(ix); err != nil {
					err = fmt.Errorf("%s/%s: %w", mesh, typ, err)
					return false
				}
			}
			return true
		})
		return err == nil
	})
	return err
}

// FreeSlots counts the free slots inside the bitmaps' blocks of s (slots a
// patch freed and none took since): a snapshot built at once has none.
func FreeSlots(s *Snapshot) int {
	n := 0
	s.meshes.Range(func(_ string, ms *meshState) bool {
		ms.types.Range(func(_ string, ts *typeState) bool {
			for _, ix := range []*index.Index{ts.rules, ts.audit.rules} {
				n += ix.FreeSlots()
			}
			return true
		})
		return true
	})
	return n
}

// BitmapsDigest hashes every block of every index of s (slots, bitmaps,
// directories): a snapshot's digest never changes, whatever later snapshots
// an update makes from it.
func BitmapsDigest(s *Snapshot) uint64 {
	h := uint64(14695981039346656037)
	mix := func(x uint64) { h = (h ^ x) * 1099511628211 }
	s.meshes.Range(func(_ string, ms *meshState) bool {
		ms.types.Range(func(_ string, ts *typeState) bool {
			for _, ix := range []*index.Index{ts.rules, ts.audit.rules} {
				ix.Digest(mix)
			}
			return true
		})
		return true
	})
	return h
}

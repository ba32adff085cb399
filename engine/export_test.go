package engine

import (
	"fmt"
	"slices"
	"unsafe"

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
func (ms *meshState) chooseByScan(ts *typeState, dst resource.Tags, sc *scratch, shadow bool) *compiledPolicy {
	if ts == nil {
		return nil
	}
	var best destChoice
	ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
		if cp.err != "" || cp.audit() && !shadow || !sc.isMember(1, cp.scopeOrd()) {
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

// CheckBitmaps holds the bitmaps of every index of s to the rules the index
// files: per class, the blocks' slots in order (free ones too), every rule
// held once, and per held slot and dimension exactly the bits its terms ask
// (a rule verified whole, resid, may have more candidates, never fewer); no
// bit past the slots. It returns the first difference.
func CheckBitmaps(s *Snapshot) error {
	return checkRuleIndexes(s, func(ix *ruleIndex) bool { return ix.bits != nil }, checkBits)
}

// checkRuleIndexes runs check on each rule index of both ends of s (the
// policies' and the audit's) that keep selects, and returns the first error,
// named by its mesh and type.
func checkRuleIndexes(s *Snapshot, keep func(*ruleIndex) bool, check func(*ruleIndex) error) error {
	var err error
	s.meshes.Range(func(mesh string, ms *meshState) bool {
		ms.types.Range(func(typ string, ts *typeState) bool {
			for _, ix := range []*ruleIndex{ts.rules, ts.audit.rules} {
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

func checkBits(ix *ruleIndex) error {
	want, live := map[*rule]bool{}, map[*rule]bool{}
	ix.each(func(r *rule) { want[r], live[r] = true, true })
	for cl, blocks := range ix.bits.classes {
		var prev *rule
		for bi, b := range blocks {
			if b.n > len(b.all)*64 || b.n > blockMax || len(b.rules) != (b.n+slotChunk-1)/slotChunk {
				return fmt.Errorf("class %d block %d: %d slots in %d words, %d chunks", cl, bi, b.n, len(b.all), len(b.rules))
			}
			// Per dimension, the values whose rules hold each slot.
			in := make([]map[int][]uint32, len(b.dims))
			for di := range b.dims {
				d := &b.dims[di]
				in[di] = map[int][]uint32{}
				for _, v := range d.vids {
					eb, list := d.exact(v)
					for s := 0; s < b.n; s++ {
						if eb != nil && eb[s/64]&(1<<(s%64)) != 0 {
							in[di][s] = append(in[di][s], v)
						}
					}
					for _, s := range list {
						in[di][int(s)] = append(in[di][int(s)], v)
					}
				}
			}
			held := 0
			removed := map[*rule]bool{} // kept alive by free slots
			for s := 0; s < b.n; s++ {
				r := b.at(s)
				if prev != nil && r.key.less(&prev.key) {
					return fmt.Errorf("class %d block %d slot %d: out of order", cl, bi, s)
				}
				prev = r
				if !b.holds(s) {
					if !live[r] {
						removed[r] = true
					}
					continue
				}
				held++
				if !want[r] || classOf(r) != cl {
					return fmt.Errorf("class %d block %d slot %d: a rule the index does not file here (or twice)", cl, bi, s)
				}
				delete(want, r)
				if err := checkSlot(ix, b, s, r, in); err != nil {
					return fmt.Errorf("class %d block %d slot %d (%s): %w", cl, bi, s, r.id, err)
				}
			}
			if held == 0 {
				return fmt.Errorf("class %d block %d: empty", cl, bi)
			}
			if len(removed) > b.stale || b.stale > staleMax {
				return fmt.Errorf("class %d block %d: free slots keep %d removed rules alive, %d counted (at most %d)", cl, bi, len(removed), b.stale, staleMax)
			}
			past := func(ws []uint64) bool {
				for p := b.n; p < len(ws)*64; p++ {
					if ws[p/64]&(1<<(p%64)) != 0 {
						return true
					}
				}
				return false
			}
			if past(b.all) || past(b.resid) {
				return fmt.Errorf("class %d block %d: bits past the slots", cl, bi)
			}
			for _, d := range b.dims {
				if past(d.any) || past(d.absent) {
					return fmt.Errorf("class %d block %d: bits past the slots", cl, bi)
				}
				for _, r := range d.refs {
					if r.n != 0 && !slices.IsSorted(d.pos[r.off:r.off+r.n]) {
						return fmt.Errorf("class %d block %d: positions out of order", cl, bi)
					}
				}
			}
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("%d rules filed in no block", len(want))
	}
	return nil
}

// checkSlot holds slot s of b, which holds r, to r's terms; values are the
// values whose rules hold each slot, per dimension.
func checkSlot(ix *ruleIndex, b *bitBlock, s int, r *rule, values []map[int][]uint32) error {
	resid := b.resid[s/64]&(1<<(s%64)) != 0
	rids := ix.lookupIDs(r, nil)
	bit := func(ws []uint64) bool { return ws[s/64]&(1<<(s%64)) != 0 }
	for _, id := range rids {
		if !slices.ContainsFunc(b.dims, func(d bitDim) bool { return d.kid == id.kid }) && !resid {
			return fmt.Errorf("key %d is no dimension and the rule is not verified whole", id.kid)
		}
	}
	for di, d := range b.dims {
		vid, pres, conflict := dimTerm(rids, d.kid)
		in := values[di][s] // the values whose rules hold s
		any, absent := bit(d.any), bit(d.absent)
		var ok bool
		switch {
		case conflict: // filed under no value
			ok = !any && !absent && len(in) == 0
		case vid != 0: // under its value, or verified whole
			ok = !absent && (!any && len(in) == 1 && in[0] == vid || resid && any && len(in) == 0)
		case pres:
			ok = any && !absent && len(in) == 0
		default:
			ok = any && absent && len(in) == 0
		}
		if !ok {
			return fmt.Errorf("dimension %d: any %v absent %v values %v resid %v; the rule: value %d presence %v conflict %v",
				d.kid, any, absent, in, resid, vid, pres, conflict)
		}
	}
	return nil
}

// FreeSlots counts the free slots inside the bitmaps' blocks of s (slots a
// patch freed and none took since): a snapshot built at once has none.
func FreeSlots(s *Snapshot) int {
	n := 0
	s.meshes.Range(func(_ string, ms *meshState) bool {
		ms.types.Range(func(_ string, ts *typeState) bool {
			for _, ix := range []*ruleIndex{ts.rules, ts.audit.rules} {
				if ix == nil || ix.bits == nil {
					continue
				}
				for _, blocks := range ix.bits.classes {
					for _, b := range blocks {
						n += b.n - b.live()
					}
				}
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
	words := func(ws []uint64) {
		mix(uint64(len(ws)))
		for _, w := range ws {
			mix(w)
		}
	}
	s.meshes.Range(func(_ string, ms *meshState) bool {
		ms.types.Range(func(_ string, ts *typeState) bool {
			for _, ix := range []*ruleIndex{ts.rules, ts.audit.rules} {
				if ix == nil || ix.bits == nil {
					continue
				}
				for _, blocks := range ix.bits.classes {
					for _, b := range blocks {
						mix(uint64(b.n))
						for i := 0; i < b.n; i++ {
							mix(uint64(uintptr(unsafe.Pointer(b.at(i)))))
						}
						words(b.all)
						words(b.resid)
						for _, d := range b.dims {
							mix(uint64(d.kid))
							words(d.any)
							words(d.absent)
							words(d.words)
							for _, v := range d.vids {
								mix(uint64(v))
							}
							for _, r := range d.refs {
								mix(uint64(r.off)<<32 | uint64(r.n))
							}
							for _, q := range d.pos {
								mix(uint64(q))
							}
						}
					}
				}
			}
			return true
		})
		return true
	})
	return h
}

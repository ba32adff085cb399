package analysis

// Lint's rule index over the space (docs/lint.md, "Cost"): per dimension,
// which rules allow which class, as bitmaps over the rule order. It answers
// three questions in a few word operations per dimension, where a scan of
// the rules would cost one formula per rule:
//   - which rules match one flow (a point box): Decide's candidates there;
//   - which rules may match together with a box (meets);
//   - which rules match everywhere on a box (contains).
// Every answer is exact: the search still settles what the index leaves
// open, and the index only ever narrows what the search looks at.

import (
	"math/bits"

	"github.com/verdictpdp/verdict/engine/resource"
)

// ruleSet is a set of rule positions (lintPart.rules), one bit each.
type ruleSet []uint64

func newRuleSet(n int) ruleSet { return make(ruleSet, (n+63)/64) }

func (s ruleSet) add(i int32) { s[i>>6] |= 1 << (uint(i) & 63) }

func (s ruleSet) remove(i int32) { s[i>>6] &^= 1 << (uint(i) & 63) }

func (s ruleSet) has(i int32) bool { return s[i>>6]&(1<<(uint(i)&63)) != 0 }

func (s ruleSet) and(t ruleSet) {
	for i := range s {
		s[i] &= t[i]
	}
}

func (s ruleSet) andNot(t ruleSet) {
	for i := range s {
		s[i] &^= t[i]
	}
}

// keepRange keeps only the positions in [lo, hi).
func (s ruleSet) keepRange(lo, hi int32) {
	for w := range s {
		base := int32(w) * 64
		switch {
		case base+64 <= lo || base >= hi:
			s[w] = 0
			continue
		}
		if lo > base {
			s[w] &^= 1<<uint(lo-base) - 1
		}
		if hi < base+64 {
			s[w] &= 1<<uint(hi-base) - 1
		}
	}
}

// next is the first position ≥ i in s; -1 when none.
func (s ruleSet) next(i int32) int32 {
	w := int(i >> 6)
	if w >= len(s) {
		return -1
	}
	cur := s[w] &^ (1<<(uint(i)&63) - 1)
	for {
		if cur != 0 {
			return int32(w*64 + bits.TrailingZeros64(cur))
		}
		w++
		if w == len(s) {
			return -1
		}
		cur = s[w]
	}
}

func (s classSet) has(i int) bool { return i/64 < len(s) && s[i/64]&(1<<(i%64)) != 0 }

// ruleIndex indexes the rules of a partition by the classes they allow, per
// dimension: the rules that do not test it (open), those that allow one
// class of it (by class), and those that allow several (with their set).
// A rule that never matches is in none.
type ruleIndex struct {
	n     int
	all   ruleSet // every rule that may match
	open  []ruleSet
	one   [][][]int32
	multi [][]multiEntry
	deny  ruleSet // the DENY rules
	tmp   ruleSet
	// allowing's answers, kept while they fit in cacheWords words
	cache     [][]ruleSet
	cacheLeft int
}

// cacheWords bounds the memory of the index's cache of per-class bitmaps
// (8 bytes a word).
const cacheWords = 4 << 20

type multiEntry struct {
	rule int32
	set  classSet
}

func newRuleIndex(sp *space, rules []*lintRule) *ruleIndex {
	n := len(rules)
	ix := &ruleIndex{n: n, all: newRuleSet(n), deny: newRuleSet(n), tmp: newRuleSet(n)}
	ix.open = make([]ruleSet, sp.dims())
	ix.cache = make([][]ruleSet, sp.dims())
	ix.cacheLeft = cacheWords
	ix.one = make([][][]int32, sp.dims())
	ix.multi = make([][]multiEntry, sp.dims())
	for d := range ix.open {
		ix.open[d] = newRuleSet(n)
		ix.one[d] = make([][]int32, sp.classes(d))
		ix.cache[d] = make([]ruleSet, sp.classes(d))
	}
	for i, lr := range rules {
		if lr.r.Action == resource.Deny {
			ix.deny.add(int32(i))
		}
		if lr.never {
			continue
		}
		ix.all.add(int32(i))
		k := 0
		for d := range ix.open {
			if k < len(lr.match) && lr.match[k].dim == d {
				s := lr.match[k].set
				k++
				if sp.dimFull(d).subsetOf(s) {
					ix.open[d].add(int32(i)) // a test every class passes
					continue
				}
				if c := s.first(); onlyOne(s) {
					ix.one[d][c] = append(ix.one[d][c], int32(i))
				} else {
					ix.multi[d] = append(ix.multi[d], multiEntry{rule: int32(i), set: s})
				}
				continue
			}
			ix.open[d].add(int32(i))
		}
	}
	return ix
}

// classes is how many classes dimension d has.
func (sp *space) classes(d int) int {
	if d == sp.portDim() {
		return len(sp.ports.reps)
	}
	return len(sp.keys[d%len(sp.keys)].reps)
}

// allowed is the set of the rules that allow class c on dimension d; it
// may be shared: do not modify.
func (ix *ruleIndex) allowed(d, c int) ruleSet {
	if s := ix.cache[d][c]; s != nil {
		return s
	}
	if ix.cacheLeft < len(ix.all) {
		ix.allowing(d, c, ix.tmp)
		return ix.tmp
	}
	s := newRuleSet(ix.n)
	ix.allowing(d, c, s)
	ix.cache[d][c] = s
	ix.cacheLeft -= len(s)
	return s
}

// allowing sets dst to the rules that allow class c on dimension d.
func (ix *ruleIndex) allowing(d, c int, dst ruleSet) {
	copy(dst, ix.open[d])
	for _, i := range ix.one[d][c] {
		dst.add(i)
	}
	for _, m := range ix.multi[d] {
		if m.set.has(c) {
			dst.add(m.rule)
		}
	}
}

// matchAt sets dst to the rules that match the flow of a point box (one
// class per dimension).
func (ix *ruleIndex) matchAt(dst ruleSet, pt box) {
	copy(dst, ix.all)
	for d, s := range pt {
		dst.and(ix.allowed(d, s.first()))
	}
}

// meets sets dst to the rules whose match meets box b somewhere.
func (ix *ruleIndex) meets(dst ruleSet, sp *space, b box) {
	copy(dst, ix.all)
	for d, s := range b {
		if s == nil || sp.dimFull(d).subsetOf(s) {
			continue
		}
		if onlyOne(s) {
			dst.and(ix.allowed(d, s.first()))
			continue
		}
		// every rule is open on d, or allows one class of it, or several:
		// build from the smaller side of s
		t := ix.tmp
		in := 0
		for _, w := range s {
			in += bits.OnesCount64(w)
		}
		if 2*in <= len(ix.one[d]) {
			copy(t, ix.open[d])
			for c, list := range ix.one[d] {
				if s.has(c) {
					for _, i := range list {
						t.add(i)
					}
				}
			}
		} else {
			copy(t, ix.all)
			for c, list := range ix.one[d] {
				if !s.has(c) {
					for _, i := range list {
						t.remove(i)
					}
				}
			}
		}
		for _, m := range ix.multi[d] {
			if m.set.disjoint(s) {
				t.remove(m.rule)
			} else {
				t.add(m.rule)
			}
		}
		dst.and(t)
	}
}

// contains sets dst to the rules whose match holds everywhere on box b.
// Like meets and matchAt, it fills only len(dst) words: a caller that needs
// only the first rules passes a shorter set.
func (ix *ruleIndex) contains(dst ruleSet, sp *space, b box) {
	copy(dst, ix.all)
	for d := range ix.open {
		s := b.get(sp, d)
		if b[d] == nil || sp.dimFull(d).subsetOf(s) {
			dst.and(ix.open[d]) // a rule's test that every class passes is filed as open
			continue
		}
		if onlyOne(s) {
			dst.and(ix.allowed(d, s.first()))
			continue
		}
		t := ix.tmp
		copy(t, ix.open[d])
		for _, m := range ix.multi[d] {
			if s.subsetOf(m.set) {
				t.add(m.rule)
			}
		}
		dst.and(t)
	}
}

// scratch hands out a rule set of the partition's size, its contents
// undefined; release takes it back.
func (lp *lintPart) scratch() ruleSet {
	if n := len(lp.pool); n > 0 {
		s := lp.pool[n-1]
		lp.pool = lp.pool[:n-1]
		return s
	}
	return newRuleSet(len(lp.rules))
}

func (lp *lintPart) release(s ...ruleSet) { lp.pool = append(lp.pool, s...) }

// candidatesAt lists, in order, the rules that match the flow of a point
// box and are candidates on side there.
func (lp *lintPart) candidatesAt(pt box, side int) []int32 {
	m := lp.scratch()
	defer lp.release(m)
	lp.ix.matchAt(m, pt)
	m.and(lp.sides[side])
	var out []int32
	for i := m.next(0); i >= 0; i = m.next(i + 1) {
		if lp.holds(lp.rules[i].cand[side], pt) {
			out = append(out, i)
		}
	}
	return out
}

// winner is the rule that decides among a flow's candidates (in order), the
// rule at position skip left out: under DenyOverrides the first DENY, else
// the first (docs/order.md); -1 when none is left.
func (lp *lintPart) winner(cands []int32, skip int) int32 {
	first := int32(-1)
	for _, i := range cands {
		if int(i) == skip {
			continue
		}
		if lp.set.Combine != resource.DenyOverrides || lp.ix.deny.has(i) {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return first
}

// decidesAtWithout reports whether lr decides side at the flow of a point
// box once the rule at position skip (-1: none) is removed: the side is
// examined, lr matches as a candidate, and no rule that beats it does.
func (lp *lintPart) decidesAtWithout(lr *lintRule, pt box, side, skip int) bool {
	if lr.cand[side] == nil || lr.never || !lp.holds(lp.exam[side], pt) || !lp.holds(lr.cand[side], pt) ||
		!lp.holds(conjPred(lr.match), pt) {
		return false
	}
	m := lp.scratch()
	defer lp.release(m)
	hi := lp.beaters(m, lr)
	m = m[:hi]
	m.and(lp.sides[side][:hi])
	if skip >= 0 && skip>>6 < hi {
		m[skip>>6] &^= 1 << (uint(skip) & 63)
	}
	for d, s := range pt {
		m.and(lp.ix.allowed(d, s.first())[:hi])
	}
	for i := m.next(0); i >= 0; i = m.next(i + 1) {
		if lp.holds(lp.rules[i].cand[side], pt) {
			return false
		}
	}
	return true
}

// repair looks for a flow of start where no rule of covers matches as a
// candidate on side and every pos holds, among the flows that differ from
// the point pt on one dimension: the rules that match pt on every other
// dimension are known at once from the products of the per-class sets
// before and after that dimension. Each flow tried counts as a box of the
// search's budget.
func (lp *lintPart) repair(start, pt box, covers ruleSet, side int, pos []*pred) (box, bool) {
	dims := len(pt)
	if dims > maxRepairDims {
		return nil, false
	}
	sets := make([]ruleSet, 0, 2*dims+2)
	defer func() { lp.release(sets...) }()
	get := func() ruleSet {
		s := lp.scratch()
		sets = append(sets, s)
		return s
	}
	// suf[d]: covers matching pt on every dimension from d on
	suf := make([]ruleSet, dims+1)
	suf[dims] = get()
	clear(suf[dims])
	copy(suf[dims], covers) // covers may be shorter: the rules after it are none
	for d := dims - 1; d >= 0; d-- {
		suf[d] = get()
		copy(suf[d], suf[d+1])
		suf[d].and(lp.ix.allowed(d, pt[d].first()))
	}
	pre := get()
	for i := range pre {
		pre[i] = ^uint64(0)
	}
	base, m := get(), get()
	for d := 0; d < dims; d++ {
		if s := start.get(lp.sp, d); !onlyOne(s) {
			copy(base, pre)
			base.and(suf[d+1])
			at := pt[d].first()
			for c := s.first(); c >= 0; c = s.next(c + 1) {
				if c == at {
					continue
				}
				if lp.steps++; lp.steps > lp.budget {
					return nil, false // the search gives up at once
				}
				copy(m, base)
				m.and(lp.ix.allowed(d, c))
				try := pt.with(d, single(len(s)*64, c))
				if lp.noneHolds(m, try, side) && lp.holdsAll(pos, try) {
					return lp.sp.pointBox(try), true // pt may be a scratch box
				}
			}
		}
		pre.and(lp.ix.allowed(d, pt[d].first()))
	}
	return nil, false
}

// maxRepairDims bounds repair's memory: two rule sets per dimension.
const maxRepairDims = 64

// noneHolds reports whether no rule of m is a candidate on side at the
// point box pt (they all match it).
func (lp *lintPart) noneHolds(m ruleSet, pt box, side int) bool {
	for i := m.next(0); i >= 0; i = m.next(i + 1) {
		if lp.holds(lp.rules[i].cand[side], pt) {
			return false
		}
	}
	return true
}

// next is the first class ≥ i in s; -1 when none.
func (s classSet) next(i int) int {
	for w := i / 64; w < len(s); w++ {
		cur := s[w]
		if w == i/64 {
			cur &^= 1<<(i%64) - 1
		}
		if cur != 0 {
			return w*64 + bits.TrailingZeros64(cur)
		}
	}
	return -1
}

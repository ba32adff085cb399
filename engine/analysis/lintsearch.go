package analysis

// Lint's splitting search (docs/lint.md, "Exact over every tag set"): it
// evaluates the formulas on a box with three values and splits the box on
// a condition it straddles until every part is settled. A split changes
// one dimension of the box, so a negation that is a plain conjunction (a
// rule's match, when its candidacy holds everywhere) is carried from a box
// to its halves with the count of its conditions the box straddles, and
// only its condition on the split dimension is looked at again; the others
// are evaluated whole at each box.

// negItem is one negation of a search, with what the search knows of it on
// the current box.
type negItem struct {
	c    *cover
	part int32 // a conjunction's: how many of its conditions the box straddles; -1 not yet counted
	conj bool  // the negation is a conjunction (c.p.c); else it is evaluated whole
}

// search looks for a flow in b where every pos holds and no neg does; at
// such a box, leaf settles it (nil: found). Negations that hold on a whole
// box are recorded in used. Before splitting, it tries the box's simplest
// point: most rules decide the flow of their box's simplest point (the keys
// they do not test absent), which a search would reach only after
// splitting on every cover. The search counts its boxes in lp.steps and
// gives up past lp.budget.
func (lp *lintPart) search(b box, pos []*pred, negs []cover, used map[int32]bool, leaf func(box) result) (box, result) {
	items := make([]negItem, len(negs))
	for i := range negs {
		items[i] = negItem{c: &negs[i], part: -1, conj: negs[i].p.op == opConj}
	}
	return lp.searchIn(b, pos, items, -1, nil, used, leaf)
}

// searchIn is search on a box that differs from its parent's on dimension
// d (-1: the first box), where the parent's set was was.
func (lp *lintPart) searchIn(b box, pos []*pred, negs []negItem, d int, was classSet, used map[int32]bool, leaf func(box) result) (box, result) {
	lp.steps++
	if lp.steps > lp.budget {
		return nil, resExhausted
	}
	var split *atom
	var keepPos []*pred
	for _, p := range pos {
		v, a := lp.sp.eval(p, b)
		switch v {
		case triNo:
			return nil, resNone
		case triPart:
			keepPos = append(keepPos, p)
			if split == nil {
				split = a
			}
		}
	}
	// The kept negations go on lp.negs, above the parent's, and are taken
	// off on the way out.
	start := len(lp.negs)
	defer func() { lp.negs = lp.negs[:start] }()
	for _, n := range negs {
		v := lp.settle(&n, b, d, was)
		switch v {
		case triYes:
			if used != nil {
				used[n.c.rule] = true
			}
			return nil, resNone
		case triPart:
			lp.negs = append(lp.negs, n)
			if split == nil {
				split = lp.straddled(&n, b)
			}
		}
	}
	keepNegs := lp.negs[start:len(lp.negs):len(lp.negs)]
	if split != nil && leaf == nil && len(keepNegs) > 0 && lp.probe(b, keepPos, keepNegs) {
		return lp.sp.pointBox(b), resFound
	}
	if split == nil {
		if leaf == nil {
			return b, resFound
		}
		if r := leaf(b); r != resNone {
			return b, r
		}
		return nil, resNone
	}
	in, out := lp.sp.split(b, split)
	exhausted := false
	for _, half := range [2]box{in, out} {
		got, r := lp.searchIn(half, keepPos, keepNegs, split.dim, b.get(lp.sp, split.dim), used, leaf)
		switch r {
		case resFound:
			return got, r
		case resExhausted:
			if leaf != nil {
				return nil, r
			}
			exhausted = true
		}
	}
	if exhausted {
		return nil, resExhausted
	}
	return nil, resNone
}

// settle evaluates a negation on b, which differs from the box it was last
// evaluated on in dimension d only, where that box's set was was.
func (lp *lintPart) settle(n *negItem, b box, d int, was classSet) tri {
	if !n.conj {
		v, _ := lp.sp.eval(n.c.p, b)
		return v
	}
	c := n.c.p.c
	if n.part < 0 || d < 0 {
		n.part = 0
		for i := range c {
			a := &c[i]
			s := b.get(lp.sp, a.dim)
			switch {
			case s.subsetOf(a.set):
			case s.disjoint(a.set):
				return triNo
			default:
				n.part++
			}
		}
	} else if a := c.on(d); a != nil {
		// the parent box straddled or held in a's set (never outside it)
		s := b.get(lp.sp, d)
		if s.disjoint(a.set) {
			return triNo
		}
		if !was.subsetOf(a.set) {
			n.part--
		}
		if !s.subsetOf(a.set) {
			n.part++
		}
	}
	if n.part == 0 {
		return triYes
	}
	return triPart
}

// straddled is a condition of a negation that b straddles (it is triPart
// on b): the first, as eval finds it.
func (lp *lintPart) straddled(n *negItem, b box) *atom {
	if !n.conj {
		_, a := lp.sp.eval(n.c.p, b)
		return a
	}
	_, a := lp.sp.evalConj(n.c.p.c, b)
	return a
}

// on is c's condition on dimension d; nil when it has none.
func (c conj) on(d int) *atom {
	lo, hi := 0, len(c)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case c[m].dim < d:
			lo = m + 1
		case c[m].dim > d:
			hi = m
		default:
			return &c[m]
		}
	}
	return nil
}

// probe tests the simplest point of b: every pos holds there and no neg.
func (lp *lintPart) probe(b box, pos []*pred, negs []negItem) bool {
	pb := lp.sp.pointBox(b)
	for _, p := range pos {
		if v, _ := lp.sp.eval(p, pb); v != triYes {
			return false
		}
	}
	for i := range negs {
		n := &negs[i]
		if !n.conj {
			if v, _ := lp.sp.eval(n.c.p, pb); v != triNo {
				return false
			}
			continue
		}
		holds := true
		c := n.c.p.c
		for k := range c {
			a := &c[k]
			if !a.set.has(pb[a.dim].first()) {
				holds = false
				break
			}
		}
		if holds {
			return false
		}
	}
	return true
}

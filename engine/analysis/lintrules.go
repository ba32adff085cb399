package analysis

// Lint's rule findings (docs/lint.md): shadowed, redundant, conflicting
// ties. A rule R decides side s of a flow when the side is examined (not
// unenforced, not applicable), R matches the flow, R is a candidate on s
// (its scope holds the side's workload) and no rule that beats R (the
// rules before it; under DenyOverrides, every DENY rule before an ALLOW
// one) is a matching candidate there. Each of those is a formula over the
// partition's space (lintspace.go), and the search settles it.

import (
	"fmt"
	"iter"
	"reflect"
	"slices"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// lintPart is one partition being linted.
type lintPart struct {
	p      *engine.Partition
	set    engine.Settings
	scopes []engine.ScopeView
	sp     *space
	rules  []*lintRule // the enforced rules, in order
	member [2][]*pred  // per side, per scope ord: the side's workload is a member
	exam   [2]*pred    // per side: the side is examined at all
	budget int
	steps  int
	proofs *[]LintProof    // the tests' (LintRequest.proofs)
	only   map[string]bool // LintRequest.ShadowedOf
	ix     *ruleIndex      // the rules by the classes they allow (lintbits.go)
	pool   []ruleSet       // scratch rule sets (lintPart.scratch)
	pt     box             // a scratch point box (lintPart.point) and its words
	ptw    classSet
	negs   []negItem  // the search's stack of negations (lintsearch.go)
	sides  [2]ruleSet // per side: the rules that may be candidates there
	run0   []int32    // per rule: the first rule of its rank (lintTies)
	approx bool       // some key's classes are not exact (lintspace.go)
	// mirror: both sides read the same formulas (every rule a candidate on
	// both, scope membership and examination alike, no targetRef policy):
	// what holds on one side holds on the other.
	mirror bool
}

// lintRule is one enforced rule with its match.
type lintRule struct {
	r     *index.Rule
	pos   int
	match conj
	never bool      // the match is empty
	cand  [2]*pred  // per side: a candidate there (nil: never)
	wit   *lintWit  // a flow it decides, when one was found
	found [2]box    // per side: a point box of a flow it decides, when one was found
	reg   box       // the box of its match, built on need (lintPart.region)
	stat  [2]result // per side: whether it decides some flow
	// per side, built on need: its "matches and is a candidate"
	dec [2]*pred
}

// lintWit is a flow a rule decides, on a side.
type lintWit struct {
	side int
	b    box
}

// result is a search's outcome.
type result uint8

const (
	resNone      result = iota // no flow satisfies the formula
	resFound                   // one does (the box holds it)
	resExhausted               // the budget ran out
)

func newLintPart(p *engine.Partition, budget int) *lintPart {
	lp := &lintPart{p: p, set: p.Settings(), scopes: p.Scopes(), sp: newSpace(p, true), budget: budget}
	sp := lp.sp
	// membership, per side and scope
	n := len(lp.scopes)
	for side := 0; side < 2; side++ {
		own := make([]*pred, n+1)
		for _, si := range lp.scopes {
			var terms []*pred
			for i := range si.Doc.Selectors {
				if c, ok := sp.selectorConj(&si.Doc.Selectors[i], side); ok {
					terms = append(terms, conjPred(c))
				}
			}
			own[si.Ord] = orPred(terms...)
		}
		lp.member[side] = make([]*pred, n+1)
		lp.member[side][0] = predTrue
		for _, si := range lp.scopes {
			parts := []*pred{own[si.Ord]}
			for _, a := range si.Ancestors {
				parts = append(parts, own[a])
			}
			lp.member[side][si.Ord] = andPred(parts...)
		}
		lp.exam[side] = lp.examined(side)
	}
	// the rules, in order
	p.Rules(false).Each(func(r *index.Rule) { lp.rules = append(lp.rules, &lintRule{r: r}) })
	slices.SortFunc(lp.rules, func(a, b *lintRule) int {
		if a.r.Key.Less(&b.r.Key) {
			return -1
		}
		if b.r.Key.Less(&a.r.Key) {
			return 1
		}
		return 0
	})
	for i, lr := range lp.rules {
		lr.pos = i
		r := lr.r
		src, ok1 := sp.selectorConj(matcherSel(r.Src), 0)
		dst, ok2 := sp.selectorConj(matcherSel(r.Dst), 1)
		m, ok3 := src.and(dst)
		ports := sp.ports.setOf(r.Ports)
		if !ports.empty() && !ports.subsetOf(sp.ports.zeroSet()) {
			m, ok3 = m.and(conj{{dim: sp.portDim(), set: ports}})
		}
		lr.never = !ok1 || !ok2 || !ok3 || ports.empty()
		lr.match = m
		for side := 0; side < 2; side++ {
			if r.Sides&index.SideBits[side] != 0 {
				lr.cand[side] = lp.member[side][r.Scope]
			}
		}
	}
	lp.ix = newRuleIndex(sp, lp.rules)
	lp.run0 = make([]int32, len(lp.rules))
	for side := range lp.sides {
		lp.sides[side] = newRuleSet(len(lp.rules))
	}
	for i, lr := range lp.rules {
		for side := range lp.sides {
			if lr.cand[side] != nil {
				lp.sides[side].add(int32(i))
			}
		}
		if i > 0 && sameRank(&lp.rules[i-1].r.Key, &lr.r.Key) {
			lp.run0[i] = lp.run0[i-1]
		} else {
			lp.run0[i] = int32(i)
		}
	}
	for _, ks := range sp.keys {
		lp.approx = lp.approx || ks.approx
	}
	c := p.Counts()
	lp.mirror = lp.exam[0] == lp.exam[1] && slices.Equal(lp.member[0], lp.member[1]) && slices.Equal(lp.sides[0], lp.sides[1]) &&
		c.SD == c.Policies
	return lp
}

func onlyOne(s classSet) bool {
	n := 0
	for _, w := range s {
		n += bitsOnes(w)
	}
	return n == 1
}

func bitsOnes(w uint64) int {
	n := 0
	for ; w != 0; w &= w - 1 {
		n++
	}
	return n
}

func matcherSel(m *index.Matcher) *resource.Selector {
	if m == nil {
		return nil
	}
	return m.Sel
}

// zeroSet is the empty set of port classes (a helper for comparisons).
func (ps *portSpace) zeroSet() classSet { return make(classSet, len(ps.full)) }

// examined is the formula "side is examined": the type has candidates on it
// (not NOT_APPLICABLE) and the workload's most specific scope is enforced.
func (lp *lintPart) examined(side int) *pred {
	if lp.p.NotApplicable(side) {
		return predFalse
	}
	// For every unenforced scope u: the workload is not a member of u, or
	// it is a member of a scope after u (more specific).
	list := lp.scopes
	var parts []*pred
	for _, u := range list {
		if u.Doc.Enforced || u.Audit {
			continue
		}
		alts := []*pred{notPred(lp.member[side][u.Ord])}
		for _, v := range list[u.Ord:] {
			if !v.Audit {
				alts = append(alts, lp.member[side][v.Ord])
			}
		}
		parts = append(parts, orPred(alts...))
	}
	return andPred(parts...)
}

// meetsOf sets dst to the rules other than lr whose match meets lr's, and
// that may be candidates on a side lr may be, through the index.
func (lp *lintPart) meetsOf(dst ruleSet, lr *lintRule) {
	if lr.never {
		clear(dst) // it meets no rule
		return
	}
	lp.ix.meets(dst, lp.sp, lp.region(lr))
	for i := range dst {
		w := uint64(0)
		if lr.cand[0] != nil {
			w |= lp.sides[0][i]
		}
		if lr.cand[1] != nil {
			w |= lp.sides[1][i]
		}
		dst[i] &= w
	}
	dst[lr.pos>>6] &^= 1 << (uint(lr.pos) & 63)
}

// beaters sets dst to the rules that beat lr when they match as
// candidates (beats); the words of dst from hi on are zero.
func (lp *lintPart) beaters(dst ruleSet, lr *lintRule) (hi int) {
	for i := range dst {
		dst[i] = ^uint64(0)
	}
	dst.keepRange(0, int32(lr.pos))
	hi = (lr.pos + 63) / 64
	if lp.set.Combine == resource.DenyOverrides {
		if lr.r.Action == resource.Deny {
			dst.and(lp.ix.deny)
		} else {
			for i := range dst {
				dst[i] |= lp.ix.deny[i]
			}
			hi = len(dst)
		}
	}
	return hi
}

// cover is a rule's "matches and is a candidate" on one side, named.
type cover struct {
	rule int32
	p    *pred
}

func (lp *lintPart) decidesOn(lr *lintRule, side int) *pred {
	if lr.dec[side] == nil {
		lr.dec[side] = andPred(conjPred(lr.match), lr.cand[side])
	}
	return lr.dec[side]
}

// point is the simplest point of b (space.pointBox) in a scratch box that
// the next call overwrites.
func (lp *lintPart) point(b box) box {
	if lp.pt == nil {
		n := 0
		for d := range b {
			n += len(lp.sp.dimFull(d))
		}
		lp.pt, lp.ptw = make(box, len(b)), make(classSet, n)
	}
	return lp.sp.pointInto(lp.pt, lp.ptw, b)
}

// region is the box of lr's match (shared: do not modify).
func (lp *lintPart) region(lr *lintRule) box {
	if lr.reg == nil {
		lr.reg, _ = lp.sp.fullBox().restrict(lp.sp, lr.match)
	}
	return lr.reg
}

// coverList is a cover set's covers, in order.
func (lp *lintPart) coverList(set ruleSet, side int) []cover {
	var out []cover
	for i := set.next(0); i >= 0; i = set.next(i + 1) {
		out = append(out, cover{rule: i, p: lp.decidesOn(lp.rules[i], side)})
	}
	return out
}

// run lints every rule of the partition.
func (lp *lintPart) run(ans *LintAnswer) {
	for _, lr := range lp.rules {
		if lr.r.Audit || lp.only != nil && !lp.only[lr.r.PolicyName()] {
			continue
		}
		ans.Rules++
		lp.lintRule(lr, ans)
	}
	if lp.set.Combine != resource.DenyOverrides && lp.only == nil {
		lp.lintTies(ans)
	}
}

func (lp *lintPart) ref(lr *lintRule) RuleRef {
	return RuleRef{Policy: lr.r.PolicyName(), Rule: lr.r.ID, Scope: lp.p.ScopeName(lr.r.Scope), Action: lr.r.Action}
}

func (lp *lintPart) finding(kind FindingKind, lr *lintRule) Finding {
	return Finding{Kind: kind, Severity: kind.Severity(), Mesh: lp.p.Mesh(), Type: lp.p.Type(), Policy: lr.r.PolicyName(), Rule: lr.r.ID,
		Scope: lp.p.ScopeName(lr.r.Scope)}
}

func (lp *lintPart) unproven(kind FindingKind, lr *lintRule, why string) Unproven {
	return Unproven{Kind: kind, Mesh: lp.p.Mesh(), Type: lp.p.Type(), Policy: lr.r.PolicyName(), Rule: lr.r.ID, Why: why}
}

// approx reports whether a rule or one it meets tests a key whose classes
// are not exact (lintspace.go).
func (lp *lintPart) approxRule(lr *lintRule) bool {
	if !lp.approx {
		return false
	}
	check := func(c conj) bool {
		for _, a := range c {
			if a.dim != lp.sp.portDim() && lp.sp.keys[a.dim%len(lp.sp.keys)].approx {
				return true
			}
		}
		return false
	}
	if check(lr.match) {
		return true
	}
	m := lp.scratch()
	defer lp.release(m)
	lp.meetsOf(m, lr)
	for i := m.next(0); i >= 0; i = m.next(i + 1) {
		if check(lp.rules[i].match) {
			return true
		}
	}
	return false
}

// lintRule settles whether lr is shadowed, else whether it is redundant.
func (lp *lintPart) lintRule(lr *lintRule, ans *LintAnswer) {
	used := map[int32]bool{}
	exhausted := false
	for side := 0; side < 2; side++ {
		if lr.cand[side] == nil || lr.never {
			continue
		}
		if side == 1 && lp.mirror && lr.cand[0] != nil {
			lr.stat[1], lr.found[1] = lr.stat[0], lr.found[0]
			continue
		}
		b, r := lp.decides(lr, side, used)
		lr.stat[side] = r
		switch r {
		case resFound:
			lr.found[side] = lp.sp.pointBox(b)
			if lr.wit == nil {
				lr.wit = &lintWit{side: side, b: b}
				lp.prove("decides", lr, b)
			}
		case resExhausted:
			exhausted = true
		}
	}
	if lr.wit != nil && lp.only != nil {
		// It decides a flow: not shadowed, and nothing else is asked.
		if !lp.approx {
			src, dst, proto, port := lp.sp.point(lr.wit.b)
			ans.Decided = append(ans.Decided, DecidedFlow{Policy: lr.r.PolicyName(), Rule: lr.r.ID, Source: src, Destination: dst,
				Protocol: proto, Port: port, Side: lr.wit.side})
		}
		return
	}
	if lr.wit != nil {
		if lp.approxRule(lr) {
			ans.Unproven = append(ans.Unproven, lp.unproven(FindingRedundant, lr,
				"a key is tested both by prefix and by CIDR, whose value classes are not split exactly"))
			return
		}
		lp.lintRedundant(lr, ans)
		return
	}
	if exhausted {
		ans.Unproven = append(ans.Unproven, lp.unproven(FindingShadowed, lr, "the search's budget ran out"))
		return
	}
	if lp.approxRule(lr) {
		ans.Unproven = append(ans.Unproven, lp.unproven(FindingShadowed, lr,
			"a key is tested both by prefix and by CIDR, whose value classes are not split exactly"))
		return
	}
	lp.reportShadowed(lr, used, ans)
}

// decides looks for a flow where lr decides side: resNone with the covers
// that settle it in used (nil: not kept), or resFound with a box of such
// flows.
func (lp *lintPart) decides(lr *lintRule, side int, used map[int32]bool) (box, result) {
	lp.steps = 0
	return lp.decidesIn(lr, side, lp.region(lr), nil, -1, used)
}

// decidesIn looks for a flow of box start where lr decides side, the rule
// at position skip (-1: none) left out, and every formula of also holds.
// Before the search, three shortcuts settle most rules: lr deciding
// start's simplest point, one rule that beats lr matching as a candidate
// on all of start, or lr deciding a flow one dimension away from that
// point. The search counts its boxes on from lp.steps.
func (lp *lintPart) decidesIn(lr *lintRule, side int, start box, also []*pred, skip int, used map[int32]bool) (box, result) {
	pos := append([]*pred{lp.exam[side], conjPred(lr.match), lr.cand[side]}, also...)
	for _, p := range pos {
		if v, _ := lp.sp.eval(p, start); v == triNo {
			return nil, resNone
		}
	}
	pt := lp.point(start)
	if lp.decidesAtWithout(lr, pt, side, skip) && lp.holdsAll(also, pt) {
		return lp.sp.pointBox(start), resFound
	}
	covers, whole := lp.scratch(), lp.scratch()
	defer lp.release(covers, whole)
	// only the rules that beat lr matter: the words from hi on are zero
	hi := lp.beaters(whole, lr)
	covers, whole = covers[:hi], whole[:hi]
	lp.ix.meets(covers, lp.sp, start)
	covers.and(whole)
	covers.and(lp.sides[side])
	if skip >= 0 && skip>>6 < hi {
		covers[skip>>6] &^= 1 << (uint(skip) & 63)
	}
	lp.ix.contains(whole, lp.sp, start)
	whole.and(covers)
	for i := whole.next(0); i >= 0; i = whole.next(i + 1) {
		if lp.holds(lp.decidesOn(lp.rules[i], side), start) {
			if used != nil {
				used[i] = true
			}
			return nil, resNone
		}
	}
	if b, ok := lp.repair(start, pt, covers, side, pos); ok {
		return b, resFound
	}
	return lp.search(start, pos, lp.coverList(covers, side), used, nil)
}

func (lp *lintPart) holdsAll(ps []*pred, b box) bool {
	for _, p := range ps {
		if !lp.holds(p, b) {
			return false
		}
	}
	return true
}

// reportShadowed builds the finding of a shadowed rule: the covering rules
// and a flow it matches, decided by one of them.
func (lp *lintPart) reportShadowed(lr *lintRule, used map[int32]bool, ans *LintAnswer) {
	f := lp.finding(FindingShadowed, lr)
	var ids []int32
	for i := range used {
		ids = append(ids, i)
	}
	slices.Sort(ids)
	for _, i := range ids {
		f.Related = append(f.Related, lp.ref(lp.rules[i]))
	}
	if lr.never {
		f.Message = "its selectors and ports can never hold together: it matches no flow"
		ans.Findings = append(ans.Findings, f)
		return
	}
	// a flow it matches as a candidate, on a side that is examined
	for side := 0; side < 2; side++ {
		if lr.cand[side] == nil {
			continue
		}
		lp.steps = 0
		b, r := lp.search(lp.region(lr), []*pred{lp.exam[side], conjPred(lr.match), lr.cand[side]}, nil, nil, nil)
		if r != resFound {
			continue
		}
		w, ok := lp.witness(b, side)
		if !ok {
			return // never a false finding
		}
		if w.Decided.Reason == engine.ReasonMatched && w.Decided.Policy == lr.r.PolicyName() && w.Decided.Rule == lr.r.ID {
			ans.Unproven = append(ans.Unproven, lp.unproven(FindingShadowed, lr, "Decide did not confirm the witness"))
			return
		}
		f.Witness = w
		f.Message = fmt.Sprintf("never decides a flow: %s decide every flow it matches", joinRefs(f.Related))
		ans.Findings = append(ans.Findings, f)
		return
	}
	f.Message = "never decides a flow: no workload it matches is ever a candidate for it (its scope, or a side never examined)"
	ans.Findings = append(ans.Findings, f)
}

func joinRefs(refs []RuleRef) string {
	if len(refs) == 0 {
		return "no rule"
	}
	s := ""
	for i, r := range refs {
		if i > 0 {
			s += ", "
		}
		s += r.String()
	}
	return s
}

// witness decides the flow at a box's point and returns it with the side's
// answer; false when Decide fails.
func (lp *lintPart) witness(b box, side int) (*Witness, bool) {
	src, dst, proto, port := lp.sp.point(b)
	d, err := lp.p.Snapshot().Decide(&engine.Request{Mesh: lp.p.Mesh(), Type: lp.p.Type(), Source: src, Destination: dst, Protocol: proto, Port: port, NoCache: true})
	if err != nil {
		return nil, false
	}
	sd := d.Outbound
	if side == 1 {
		sd = d.Inbound
	}
	sd.Conf = nil
	return &Witness{Source: src, Destination: dst, Protocol: proto, Port: port, Side: sideNames[side], Decided: sd}, true
}

// sideNames are the sides as a Witness names them.
var sideNames = [2]string{"outbound", "inbound"}

// successor is what decides a side in lr's place once lr is removed.
type successor struct {
	rule int32   // a rule's position; -1 for a catch-all or a fallback
	ref  RuleRef // for a rule, only its action (lintPart.succRef)
	conf resource.Object
	p    *pred
}

// succRef names a successor.
func (lp *lintPart) succRef(s *successor) RuleRef {
	if s.rule >= 0 {
		return lp.ref(lp.rules[s.rule])
	}
	return s.ref
}

// ruleSuccessor is the successor entry of the rule at position i.
func (lp *lintPart) ruleSuccessor(i int32, side int) successor {
	o := lp.rules[i]
	return successor{rule: i, ref: RuleRef{Action: o.r.Action}, conf: o.r.Conf, p: lp.decidesOn(o, side)}
}

// successorRules yields, for a side, the rules that decide in lr's place
// once it is removed, in the order they do: the rules after it that may
// match with it (under DenyOverrides, after a DENY rule: the DENY rules
// after it, then every ALLOW rule).
func (lp *lintPart) successorRules(lr *lintRule, side int) iter.Seq[int32] {
	return func(yield func(int32) bool) {
		m, b := lp.scratch(), lp.scratch()
		defer lp.release(m, b)
		lp.meetsOf(m, lr)
		m.and(lp.sides[side])
		lp.beaters(b, lr)
		m.andNot(b)
		if lp.set.Combine == resource.DenyOverrides && lr.r.Action == resource.Deny {
			copy(b, m)
			b.and(lp.ix.deny)
			for i := b.next(0); i >= 0; i = b.next(i + 1) {
				if !yield(i) {
					return
				}
			}
			m.andNot(lp.ix.deny)
		}
		for i := m.next(0); i >= 0; i = m.next(i + 1) {
			if !yield(i) {
				return
			}
		}
	}
}

// tail lists, for a side, what decides in lr's place after the rules: the
// catch-alls, then the side's fallback (the last entry, with p nil). ok is
// false when removing lr changes more than its own place (the last rule of
// its side or type).
func (lp *lintPart) tail(lr *lintRule, side int) ([]successor, bool) {
	var out []successor
	for _, c := range lp.p.CatchAlls() {
		if c.Audit {
			continue
		}
		out = append(out, successor{rule: -1, ref: RuleRef{Rule: "catchAll", Scope: lp.p.ScopeName(c.Scope), Action: c.Action}, p: lp.member[side][c.Scope]})
	}
	def := RuleRef{Rule: "defaultAction", Action: lp.set.DefaultAction}
	unf := RuleRef{Rule: "unenforcedAction", Action: lp.set.UnenforcedAction}
	if def.Action == unf.Action {
		return append(out, successor{rule: -1, ref: def}), true
	}
	has, ok := lp.hasCandidate(lr, side)
	if !ok {
		return nil, false
	}
	return append(out, successor{rule: -1, ref: def, p: has}, successor{rule: -1, ref: unf}), true
}

// fallbackMoves looks for a flow, on a side, that no rule decides and no
// catch-all either, where some rule is a candidate with lr and none is
// without it: removing lr turns its fallback from defaultAction into
// unenforcedAction.
func (lp *lintPart) fallbackMoves(lr *lintRule, side int) (box, result) {
	if lp.set.DefaultAction == lp.set.UnenforcedAction {
		return nil, resNone
	}
	with, _ := lp.hasCandidate(nil, side)
	without, ok := lp.hasCandidate(lr, side)
	if !ok {
		return nil, resExhausted
	}
	pos := []*pred{lp.exam[side], with, notPred(without)}
	for _, c := range lp.p.CatchAlls() {
		if !c.Audit {
			pos = append(pos, notPred(lp.member[side][c.Scope]))
		}
	}
	lp.steps = 0
	if _, r := lp.search(lp.sp.fullBox(), pos, nil, nil, nil); r != resFound {
		return nil, r
	}
	var negs []cover
	for i, o := range lp.rules {
		if o.cand[side] != nil && !o.never {
			negs = append(negs, cover{rule: int32(i), p: lp.decidesOn(o, side)})
		}
	}
	lp.steps = 0
	return lp.search(lp.sp.fullBox(), pos, negs, nil, nil)
}

// hasCandidate is the formula "some policy rule other than lr (nil: any)
// is a candidate on the side" (decide.go's hasCandidate, lr removed); false
// when removing lr would leave a side without any rule (not applicable) or
// the type without a policy.
func (lp *lintPart) hasCandidate(lr *lintRule, side int) (*pred, bool) {
	c := lp.p.Counts()
	if lr != nil && c.Policies <= 1 && len(lp.policyRules(lr)) <= 1 {
		return nil, false
	}
	if c.SD > 0 {
		var terms []*pred
		for ord, n := range lp.p.ScopeRules() {
			if lr != nil && int32(ord) == lr.r.Scope {
				n--
			}
			if n > 0 {
				terms = append(terms, lp.member[side][ord])
			}
		}
		return orPred(terms...), true
	}
	// targetRef: the policies with items on the side attach by their
	// targetRef; lr's policy still does when it keeps an item there.
	var terms []*pred
	bit := index.SideBits[side]
	found := false
	for pv := range lp.p.Policies() {
		if pv.Err != "" || pv.Audit || pv.Doc.TargetRef == nil {
			continue
		}
		n := 0
		for _, r := range pv.Rules {
			if r.Sides&bit != 0 && !r.Audit && (lr == nil || r != lr.r) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		found = true
		if t, ok := lp.sp.selectorConj(resource.TargetSelector(*pv.Doc.TargetRef), side); ok {
			terms = append(terms, conjPred(t))
		}
	}
	if !found {
		return nil, false // the side would become not applicable
	}
	return orPred(terms...), true
}

// policyRules lists the enforced rules of lr's policy.
func (lp *lintPart) policyRules(lr *lintRule) []*index.Rule {
	var out []*index.Rule
	if pv, ok := lp.p.Policy(lr.r.PolicyName()); ok {
		for _, r := range pv.Rules {
			if !r.Audit {
				out = append(out, r)
			}
		}
	}
	return out
}

// lintRedundant settles whether removing lr changes no answer: on every
// flow it decides, what decides in its place answers alike (the action and
// the conf).
func (lp *lintPart) lintRedundant(lr *lintRule, ans *LintAnswer) {
	var next *successor
	budget := lp.unproven(FindingRedundant, lr, "the search's budget ran out")
	for side := 0; side < 2; side++ {
		if lr.cand[side] == nil {
			continue
		}
		if lr.stat[side] == resExhausted {
			ans.Unproven = append(ans.Unproven, budget)
			return
		}
		tail, ok := lp.tail(lr, side)
		if !ok {
			ans.Unproven = append(ans.Unproven, lp.unproven(FindingRedundant, lr,
				"removing it would leave its side or its type without a rule, which this analysis does not follow"))
			return
		}
		if side == 1 && lp.mirror && lr.cand[0] != nil {
			continue // side 0 settled the same formulas
		}
		// The flow found deciding is the first try: in place of most
		// rules, another answers otherwise right there.
		if pt := lr.found[side]; pt != nil {
			if s := lp.successorAtPoint(lr, pt, side, tail); !s.same(lr) {
				lp.prove("changes", lr, pt)
				return
			}
		}
		// Where it decides nothing, removing it may still move the
		// fallback of flows no rule decides.
		moved, r := lp.fallbackMoves(lr, side)
		switch r {
		case resFound:
			lp.prove("changes", lr, moved)
			return
		case resExhausted:
			ans.Unproven = append(ans.Unproven, budget)
			return
		}
		if lr.stat[side] != resFound {
			continue
		}
		differs, r := lp.changes(lr, side, tail)
		switch r {
		case resFound:
			lp.prove("changes", lr, differs)
			return // a flow whose answer changes: not redundant
		case resExhausted:
			ans.Unproven = append(ans.Unproven, budget)
			return
		}
		if lr.wit.side == side {
			s := lp.successorAtPoint(lr, lp.sp.pointBox(lr.wit.b), side, tail)
			next = &s
		}
	}
	w, ok := lp.witness(lr.wit.b, lr.wit.side)
	if !ok || !(w.Decided.Policy == lr.r.PolicyName() && w.Decided.Rule == lr.r.ID) {
		ans.Unproven = append(ans.Unproven, lp.unproven(FindingRedundant, lr, "Decide did not confirm the witness"))
		return
	}
	f := lp.finding(FindingRedundant, lr)
	f.Witness = w
	msg := "removing it changes no answer: every flow it decides is decided alike without it"
	if next != nil {
		ref := lp.succRef(next)
		f.Related = []RuleRef{ref}
		msg += fmt.Sprintf(" (the witness by %s)", ref)
	}
	f.Message = msg
	ans.Findings = append(ans.Findings, f)
}

// changes looks, on a side where lr decides some flow, for a flow whose
// answer removing lr changes: one that lr decides and that, without it, a
// successor answering otherwise decides. It asks that of each such
// successor k in turn — a flow of lr's region and k's match where neither
// lr nor k is beaten by a rule other than lr — so the search partitions
// only the part of the region k matches, by the rules that beat k there.
// The flows no other rule matches go to the tail (the catch-alls and the
// fallback). The successors stop at the first that matches as a candidate
// on the whole region: nothing after it is ever reached. The budget is
// shared by the whole question.
func (lp *lintPart) changes(lr *lintRule, side int, tail []successor) (box, result) {
	region := lp.region(lr)
	whole := lp.scratch()
	defer lp.release(whole)
	lp.ix.contains(whole, lp.sp, region)
	var ks []int32
	reached := true // some flow of the region may reach the tail
	for i := range lp.successorRules(lr, side) {
		o := lp.rules[i]
		if o.r.Action != lr.r.Action || !confEqual(o.r.Conf, lr.r.Conf) {
			ks = append(ks, i)
		}
		if whole.has(i) && lp.holds(lp.decidesOn(o, side), region) {
			reached = false
			break
		}
	}
	also := []*pred{conjPred(lr.match), lr.cand[side]}
	// The simplest flow shared with each is the first try.
	for _, i := range ks {
		k := lp.rules[i]
		b, ok := region.restrict(lp.sp, k.match)
		if !ok {
			continue
		}
		if pt := lp.point(b); lp.decidesAtWithout(k, pt, side, lr.pos) && lp.holdsAll(also, pt) {
			return lp.sp.pointBox(b), resFound
		}
	}
	lp.steps = 0
	for _, i := range ks {
		k := lp.rules[i]
		b, ok := region.restrict(lp.sp, k.match)
		if !ok {
			continue
		}
		got, r := lp.decidesIn(k, side, b, also, lr.pos, nil)
		if r != resNone {
			if r == resFound {
				got = lp.sp.pointBox(got)
			}
			return got, r
		}
	}
	if !reached || !lp.tailDiffers(lr, tail) {
		return nil, resNone
	}
	// No other rule matches as a candidate: the tail decides.
	others := lp.scratch()
	defer lp.release(others)
	lp.ix.meets(others, lp.sp, region)
	others.and(lp.sides[side])
	others[lr.pos>>6] &^= 1 << (uint(lr.pos) & 63)
	pos := []*pred{lp.exam[side], conjPred(lr.match), lr.cand[side]}
	var differs box
	_, r := lp.search(region, pos, lp.coverList(others, side), nil, func(b box) result {
		var r result
		differs, r = lp.walk(b, tail, 0, lr)
		return r
	})
	return differs, r
}

// tailDiffers reports whether some entry of the tail answers otherwise
// than lr.
func (lp *lintPart) tailDiffers(lr *lintRule, tail []successor) bool {
	for k := range tail {
		if !tail[k].same(lr) {
			return true
		}
	}
	return false
}

// same reports whether the successor answers as lr does: the action and
// the conf.
func (s *successor) same(lr *lintRule) bool {
	return s.ref.Action == lr.r.Action && confEqual(s.conf, lr.r.Conf)
}

// walk settles, on a box where lr decides, whether the successor answers
// otherwise somewhere: resFound when it does.
func (lp *lintPart) walk(b box, succ []successor, k int, lr *lintRule) (box, result) {
	for ; k < len(succ); k++ {
		lp.steps++
		if lp.steps > lp.budget {
			return nil, resExhausted
		}
		s := &succ[k]
		v, a := triYes, (*atom)(nil)
		if s.p != nil {
			v, a = lp.sp.eval(s.p, b)
		}
		switch v {
		case triNo:
			continue
		case triYes:
			if s.same(lr) {
				return nil, resNone
			}
			return b, resFound
		}
		in, out := lp.sp.split(b, a)
		if got, r := lp.walk(in, succ, k, lr); r != resNone {
			return got, r
		}
		return lp.walk(out, succ, k, lr)
	}
	return nil, resNone // unreachable: the fallback holds everywhere
}

// LintProof is a flow that settles a rule the other way (the tests hold
// lint to brute force with them): "decides", a flow the rule decides (it
// is not shadowed); "changes", a flow whose answer removing it changes (it
// is not redundant).
type LintProof struct {
	What                string
	Policy, Rule        string
	Source, Destination resource.Tags
	Protocol            resource.Protocol
	Port                uint32
}

// prove records a proof when the request asks for them.
func (lp *lintPart) prove(what string, lr *lintRule, b box) {
	if lp.proofs == nil || b == nil {
		return
	}
	src, dst, proto, port := lp.sp.point(b)
	*lp.proofs = append(*lp.proofs, LintProof{What: what, Policy: lr.r.PolicyName(), Rule: lr.r.ID, Source: src, Destination: dst, Protocol: proto, Port: port})
}

// successorAtPoint is what decides side at the flow of a point box where lr
// decides, once lr is removed.
func (lp *lintPart) successorAtPoint(lr *lintRule, pt box, side int, tail []successor) successor {
	if i := lp.winner(lp.candidatesAt(pt, side), lr.pos); i >= 0 {
		return lp.ruleSuccessor(i, side)
	}
	return *lp.successorAt(pt, tail)
}

// successorAt is the successor at a box's point.
func (lp *lintPart) successorAt(b box, succ []successor) *successor {
	pb := lp.sp.pointBox(b)
	for k := range succ {
		if succ[k].p == nil {
			return &succ[k]
		}
		if v, _ := lp.sp.eval(succ[k].p, pb); v == triYes {
			return &succ[k]
		}
	}
	return nil
}

func confEqual(a, b resource.Object) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// lintTies finds pairs of rules of one rank, opposite actions, ordered
// only by the tie-break, where the first decides a flow the second matches
// as a candidate too.
func (lp *lintPart) lintTies(ans *LintAnswer) {
	for _, lr := range lp.rules {
		if lr.r.Audit || lr.never || lp.run0[lr.pos] == int32(lr.pos) {
			continue
		}
		m := lp.scratch()
		lp.meetsOf(m, lr)
		m.keepRange(lp.run0[lr.pos], int32(lr.pos))
		if lr.r.Action == resource.Deny {
			m.andNot(lp.ix.deny)
		} else {
			m.and(lp.ix.deny)
		}
		for i := m.next(0); i >= 0; i = m.next(i + 1) {
			o := lp.rules[i]
			// A rule that decides no flow ties with none.
			if o.r.Audit || o.wit == nil && !slices.Contains(o.stat[:], resExhausted) || o.r.PolicyName() == lr.r.PolicyName() {
				continue
			}
			lp.lintTie(o, lr, ans)
		}
		lp.release(m)
	}
}

// holds reports whether p holds on the whole box.
func (lp *lintPart) holds(p *pred, b box) bool {
	v, _ := lp.sp.eval(p, b)
	return v == triYes
}

func sameRank(a, b *index.OrderKey) bool {
	return a.Phase == b.Phase && a.Scope == b.Scope && a.Priority == b.Priority && a.Total == b.Total && a.Exact == b.Exact
}

func (lp *lintPart) lintTie(first, second *lintRule, ans *LintAnswer) {
	for side := 0; side < 2; side++ {
		if first.cand[side] == nil || second.cand[side] == nil {
			continue
		}
		if side == 1 && lp.mirror && first.cand[0] != nil && second.cand[0] != nil {
			return // side 0 settled the same formula
		}
		start, ok := lp.region(first).restrict(lp.sp, second.match)
		if !ok {
			return
		}
		lp.steps = 0
		b, r := lp.decidesIn(first, side, start, []*pred{conjPred(second.match), second.cand[side]}, -1, nil)
		if r != resFound {
			continue
		}
		w, ok := lp.witness(b, side)
		if !ok || w.Decided.Policy != first.r.PolicyName() || w.Decided.Rule != first.r.ID {
			return
		}
		f := lp.finding(FindingConflictingTie, second)
		f.Related = []RuleRef{lp.ref(first)}
		f.Witness = w
		f.Message = fmt.Sprintf("ties with %s (same phase, scope, priority and rank) with the opposite action: only the tie-break puts %s first",
			lp.ref(first), first.r.PolicyName())
		ans.Findings = append(ans.Findings, f)
		return
	}
}

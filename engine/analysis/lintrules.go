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
	proofs *[]LintProof // the tests' (LintRequest.proofs)
	// the index that finds the rules whose match meets a rule's: per
	// dimension, the rules that require one class of it, by class, and the
	// others
	byClass [][][]int32
	open    [][]int32
}

// lintRule is one enforced rule with its match.
type lintRule struct {
	r     *index.Rule
	pos   int
	match conj
	never bool      // the match is empty
	cand  [2]*pred  // per side: a candidate there (nil: never)
	wit   *lintWit  // a flow it decides, when one was found
	dims  []int32   // the dimensions on which it requires one class
	one   []int32   // that class, per dims entry
	meets []int32   // rules whose match meets its own (built on need)
	met   bool      // meets is built
	stat  [2]result // per side: whether it decides some flow
	// per side, built on need: its "matches and is a candidate", and the
	// covers of the rules that beat it
	dec    [2]*pred
	covers [2]*[]cover
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
	lp.byClass = make([][][]int32, sp.dims())
	lp.open = make([][]int32, sp.dims())
	for d := range lp.byClass {
		lp.byClass[d] = make([][]int32, len(sp.dimFull(d))*64)
	}
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
		constrained := map[int]bool{}
		for _, a := range m {
			constrained[a.dim] = true
			if c := a.set.first(); c >= 0 && onlyOne(a.set) {
				lr.dims = append(lr.dims, int32(a.dim))
				lr.one = append(lr.one, int32(c))
				lp.byClass[a.dim][c] = append(lp.byClass[a.dim][c], int32(i))
				continue
			}
			lp.open[a.dim] = append(lp.open[a.dim], int32(i))
		}
		for d := 0; d < sp.dims(); d++ {
			if !constrained[d] {
				lp.open[d] = append(lp.open[d], int32(i))
			}
		}
	}
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

// meetsOf returns the rules whose match meets lr's, through the index.
func (lp *lintPart) meetsOf(lr *lintRule) []int32 {
	if lr.met {
		return lr.meets
	}
	lr.met = true
	var cands []int32
	best := -1
	for i, d := range lr.dims {
		n := len(lp.byClass[d][lr.one[i]]) + len(lp.open[d])
		if best < 0 || n < best {
			best = n
			cands = append(append(cands[:0:0], lp.byClass[d][lr.one[i]]...), lp.open[d]...)
		}
	}
	if best < 0 {
		cands = make([]int32, len(lp.rules))
		for i := range cands {
			cands[i] = int32(i)
		}
	}
	slices.Sort(cands)
	for _, i := range cands {
		o := lp.rules[i]
		if int(i) == lr.pos || o.never || o.r.Sides&lr.r.Sides == 0 || !lr.match.meets(o.match) {
			continue
		}
		lr.meets = append(lr.meets, i)
	}
	return lr.meets
}

// beats reports whether o, matching and a candidate, keeps lr from
// deciding the side (docs/order.md, "Combining").
func (lp *lintPart) beats(o, lr *lintRule) bool {
	if lp.set.Combine == resource.DenyOverrides && o.r.Action != lr.r.Action {
		return o.r.Action == resource.Deny
	}
	return o.pos < lr.pos
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

// search looks for a flow in b where every pos holds and no neg does; at
// such a box, leaf settles it (nil: found). Negations that hold on a whole
// box are recorded in used.
func (lp *lintPart) search(b box, pos []*pred, negs []cover, used map[int32]bool, leaf func(box) result) (box, result) {
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
	var keepNegs []cover
	for _, n := range negs {
		v, a := lp.sp.eval(n.p, b)
		switch v {
		case triYes:
			if used != nil {
				used[n.rule] = true
			}
			return nil, resNone
		case triPart:
			keepNegs = append(keepNegs, n)
			if split == nil {
				split = a
			}
		}
	}
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
		got, r := lp.search(half, keepPos, keepNegs, used, leaf)
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

// region is the box of lr's match.
func (lp *lintPart) region(lr *lintRule) box {
	b, _ := lp.sp.fullBox().restrict(lp.sp, lr.match)
	return b
}

// probe tests the point of b: most rules decide the flow of their box's
// simplest point (the keys they do not test absent), which a search would
// reach only after splitting on every cover.
func (lp *lintPart) probe(b box, pos []*pred, negs []cover) bool {
	pb := lp.sp.pointBox(b)
	for _, p := range pos {
		if v, _ := lp.sp.eval(p, pb); v != triYes {
			return false
		}
	}
	for _, n := range negs {
		if v, _ := lp.sp.eval(n.p, pb); v != triNo {
			return false
		}
	}
	return true
}

// coversOf lists, for a side, the rules that beat lr and may match with it.
func (lp *lintPart) coversOf(lr *lintRule, side int) []cover {
	if lr.covers[side] != nil {
		return *lr.covers[side]
	}
	out := lp.coversOnce(lr, side)
	lr.covers[side] = &out
	return out
}

func (lp *lintPart) coversOnce(lr *lintRule, side int) []cover {
	var out []cover
	for _, i := range lp.meetsOf(lr) {
		o := lp.rules[i]
		if o.cand[side] == nil || !lp.beats(o, lr) {
			continue
		}
		out = append(out, cover{rule: i, p: lp.decidesOn(o, side)})
	}
	return out
}

// run lints every rule of the partition.
func (lp *lintPart) run(ans *LintAnswer) {
	for _, lr := range lp.rules {
		if lr.r.Audit {
			continue
		}
		ans.Rules++
		lp.lintRule(lr, ans)
	}
	if lp.set.Combine != resource.DenyOverrides {
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
func (lp *lintPart) approx(lr *lintRule) bool {
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
	for _, i := range lr.meets {
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
		lp.steps = 0
		pos := []*pred{lp.exam[side], conjPred(lr.match), lr.cand[side]}
		b, r := lp.search(lp.region(lr), pos, lp.coversOf(lr, side), used, nil)
		lr.stat[side] = r
		switch r {
		case resFound:
			if lr.wit == nil {
				lr.wit = &lintWit{side: side, b: b}
				lp.prove("decides", lr, b)
			}
		case resExhausted:
			exhausted = true
		}
	}
	if lr.wit != nil {
		if lp.approx(lr) {
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
	if lp.approx(lr) {
		ans.Unproven = append(ans.Unproven, lp.unproven(FindingShadowed, lr,
			"a key is tested both by prefix and by CIDR, whose value classes are not split exactly"))
		return
	}
	lp.reportShadowed(lr, used, ans)
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
	ref  RuleRef
	conf resource.Object
	p    *pred
}

// successors lists, for a side, what decides in lr's place, in order: the
// rules after it that may match with it, the catch-alls, then the side's
// fallback (the last entry, with p nil). ok is false when removing lr
// changes more than its own place (the last rule of its side or type).
func (lp *lintPart) successors(lr *lintRule, side int) ([]successor, bool) {
	var out []successor
	var after []int32
	for _, i := range lp.meetsOf(lr) {
		o := lp.rules[i]
		if o.cand[side] != nil && !lp.beats(o, lr) {
			after = append(after, i)
		}
	}
	if lp.set.Combine == resource.DenyOverrides && lr.r.Action == resource.Deny {
		// the DENY rules after it, then every ALLOW rule in order
		slices.SortStableFunc(after, func(a, b int32) int {
			da, db := lp.rules[a].r.Action == resource.Deny, lp.rules[b].r.Action == resource.Deny
			switch {
			case da && !db:
				return -1
			case db && !da:
				return 1
			}
			return int(a - b)
		})
	}
	for _, i := range after {
		o := lp.rules[i]
		out = append(out, successor{ref: lp.ref(o), conf: o.r.Conf, p: lp.decidesOn(o, side)})
	}
	for _, c := range lp.p.CatchAlls() {
		if c.Audit {
			continue
		}
		out = append(out, successor{ref: RuleRef{Rule: "catchAll", Scope: lp.p.ScopeName(c.Scope), Action: c.Action}, p: lp.member[side][c.Scope]})
	}
	def := RuleRef{Rule: "defaultAction", Action: lp.set.DefaultAction}
	unf := RuleRef{Rule: "unenforcedAction", Action: lp.set.UnenforcedAction}
	if def.Action == unf.Action {
		return append(out, successor{ref: def}), true
	}
	has, ok := lp.hasCandidate(lr, side)
	if !ok {
		return nil, false
	}
	return append(out, successor{ref: def, p: has}, successor{ref: unf}), true
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
		succ, ok := lp.successors(lr, side)
		if !ok {
			ans.Unproven = append(ans.Unproven, lp.unproven(FindingRedundant, lr,
				"removing it would leave its side or its type without a rule, which this analysis does not follow"))
			return
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
		lp.steps = 0
		pos := []*pred{lp.exam[side], conjPred(lr.match), lr.cand[side]}
		var differs box
		_, r = lp.search(lp.region(lr), pos, lp.coversOf(lr, side), nil, func(b box) result {
			var r result
			differs, r = lp.walk(b, succ, 0, lr)
			return r
		})
		switch r {
		case resFound:
			lp.prove("changes", lr, differs)
			return // a flow whose answer changes: not redundant
		case resExhausted:
			ans.Unproven = append(ans.Unproven, budget)
			return
		}
		if lr.wit.side == side {
			next = lp.successorAt(lr.wit.b, succ)
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
		f.Related = []RuleRef{next.ref}
		msg += fmt.Sprintf(" (the witness by %s)", next.ref)
	}
	f.Message = msg
	ans.Findings = append(ans.Findings, f)
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
			if s.ref.Action == lr.r.Action && confEqual(s.conf, lr.r.Conf) {
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
		if lr.r.Audit || lr.never {
			continue
		}
		for _, i := range lp.meetsOf(lr) {
			o := lp.rules[i]
			if o.pos >= lr.pos || o.r.Audit || o.r.Action == lr.r.Action || o.r.PolicyName() == lr.r.PolicyName() || !sameRank(&o.r.Key, &lr.r.Key) {
				continue
			}
			lp.lintTie(o, lr, ans)
		}
	}
}

func sameRank(a, b *index.OrderKey) bool {
	return a.Phase == b.Phase && a.Scope == b.Scope && a.Priority == b.Priority && a.Total == b.Total && a.Exact == b.Exact
}

func (lp *lintPart) lintTie(first, second *lintRule, ans *LintAnswer) {
	for side := 0; side < 2; side++ {
		if first.cand[side] == nil || second.cand[side] == nil {
			continue
		}
		lp.steps = 0
		pos := []*pred{lp.exam[side], conjPred(first.match), first.cand[side], conjPred(second.match), second.cand[side]}
		start, ok := lp.region(first).restrict(lp.sp, second.match)
		if !ok {
			return
		}
		b, r := lp.search(start, pos, lp.coversOf(first, side), nil, nil)
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

package conditions

// Shadowed rules, judged by lint (docs/lint.md), and judged again after a
// change only where the change can move them. Whether a rule R is shadowed
// depends on the frame (scopes, settings, applicable sides) and on the
// rules that may match a flow together with R and beat it: its covers. A
// change of policy P moves the covers only of the rules that overlap a rule
// P had or has and that such a rule beats (comes before, or under
// DenyOverrides denies where they allow). So those rules are linted again,
// in a world of their own policies and every policy with a rule that
// overlaps one of theirs and beats it — a world that holds all their covers, where lint answers for them exactly as
// over the whole partition. "Overlap" here is a quick test that may say yes
// for two rules that never meet (more work, never a wrong answer) and says
// no only when a tag both ends require differs.

import (
	"slices"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// judgeShadowed settles the shadowed rules of the policies whose covers
// may have changed since base (every policy when the frame changed).
func (j *judgement) judgeShadowed(frame bool, changed []string) error {
	st, base := j.st, j.base
	if j.p.Rules(false) == nil {
		return nil
	}
	if !frame {
		j.tp.ix, j.tp.ixOf = nil, nil
		if err := j.lintAll(); err != nil {
			return err
		}
		j.index(nil).prebuild() // here, rather than on the next change
		return nil
	}
	if len(changed) == 0 {
		if j.tp.ixOf == base {
			j.tp.ixOf = st
		}
		return nil
	}
	ix := j.index(changed)
	// The seeds: every enforced rule a changed policy had or has.
	var seeds, added []*index.Rule
	isChanged := map[string]bool{}
	for _, name := range changed {
		isChanged[name] = true
		if old, ok := base.policies.Get(name); ok {
			seeds = append(seeds, old.enforcedRules()...)
		}
		if ps, ok := j.fresh[name]; ok {
			added = append(added, ps.enforcedRules()...)
		}
	}
	seeds = append(seeds, added...)
	// The affected policies: the changed ones, and the owners of the rules
	// that overlap a seed that beats them, unless what lint found of the
	// rule still holds (keeps).
	affected := map[string]bool{}
	for _, name := range changed {
		if ps, ok := j.fresh[name]; ok && ps.judging() {
			affected[name] = true
		}
	}
	kept := map[*index.Rule]bool{}
	for _, r := range seeds {
		for _, o := range ix.meeting(r) {
			name := o.Policy.Name
			if affected[name] || kept[o] || !j.beats(r, o) && !j.unproven(name) {
				continue
			}
			if j.keeps(o, isChanged, added) {
				kept[o] = true
			} else {
				affected[name] = true
			}
		}
	}
	// A policy whose every rule decides its simplest flow needs no lint
	// (witness.go).
	for name := range affected {
		if j.settleQuickly(name) {
			delete(affected, name)
		}
	}
	if len(affected) == 0 {
		return nil
	}
	// The world: the affected policies and the owners of every rule that
	// overlaps one of theirs (all their covers among them). Once it holds
	// most of the partition, the partition itself is linted instead: a
	// dense set stops building it early rather than find every overlap.
	world := map[string]*resource.Policy{}
	large := func() bool { return 2*len(world) > ix.policies }
	for name := range affected {
		if large() {
			break
		}
		ps, _ := j.b.Get(name)
		world[name] = ps.doc
		for _, r := range ps.enforcedRules() {
			for _, o := range ix.meeting(r) {
				if j.beats(o, r) {
					world[o.Policy.Name] = o.Policy
				}
			}
		}
	}
	if large() || 2*len(affected) > ix.policies {
		// Most of the partition: lint it in place, the affected rules only.
		ans, err := analysis.Lint(j.s, &analysis.LintRequest{Mesh: st.mesh, Type: st.typ, Budget: j.budget, ShadowedOf: affected})
		if err != nil {
			return err
		}
		j.record(ans, affected)
		return nil
	}
	res := make([]resource.Resource, 0, len(world)+len(st.scopes)+1)
	if st.meshDoc != nil {
		res = append(res, st.meshDoc)
	}
	for _, sc := range st.scopes {
		res = append(res, sc)
	}
	for _, doc := range world {
		res = append(res, doc)
	}
	sub := engine.Build(st.rev, res)
	sp, err := sub.Partition(st.mesh, st.typ)
	if err != nil || sp.Closed() || sp.NotApplicable(0) != st.notApp[0] || sp.NotApplicable(1) != st.notApp[1] {
		// The smaller world differs in more than its rules: judge the whole.
		return j.lintAll()
	}
	ans, err := analysis.Lint(sub, &analysis.LintRequest{Mesh: st.mesh, Type: st.typ, Budget: j.budget, ShadowedOf: affected})
	if err != nil {
		return err
	}
	j.record(ans, affected)
	return nil
}

// keeps reports whether what the last judgement found of rule o (of a
// policy not changed) holds after the change: a rule shadowed stays so
// when no policy its proof stood on changed (the rules that beat it can
// only have grown); a rule that decided a flow still decides it when no
// added rule that beats it may match that flow on its side (the rules
// that beat it otherwise only shrank). Frame and partition are the
// last judgement's (judgeShadowed's caller checks).
func (j *judgement) keeps(o *index.Rule, changed map[string]bool, added []*index.Rule) bool {
	ps, ok := j.b.Get(o.Policy.Name)
	if !ok || ps.unproven {
		return false
	}
	if _, shadowed := ps.shadowed[o.ID]; shadowed {
		covers, ok := ps.covers[o.ID]
		if !ok {
			return false
		}
		for _, c := range covers {
			if changed[c] {
				return false
			}
		}
		return true
	}
	f := ps.decided[o.ID]
	if f == nil {
		return false
	}
	var src, dst resource.Tags
	for _, n := range added {
		if !j.beats(n, o) {
			continue
		}
		if src == nil {
			src, dst = tagsOf(f.src), tagsOf(f.dst)
		}
		if f.mayMatch(n, src, dst) {
			return false
		}
	}
	return true
}

// flow is a flow a rule decides on one side (analysis.DecidedFlow), its
// tags as pairs: kept for every rule not shadowed.
type flow struct {
	src, dst []index.TagKV
	proto    resource.Protocol
	port     uint32
	side     int
}

func newFlow(d *analysis.DecidedFlow) *flow {
	return &flow{src: pairsOf(d.Source), dst: pairsOf(d.Destination), proto: d.Protocol, port: d.Port, side: d.Side}
}

// mayMatch reports whether rule n may match the flow (its tags src and
// dst) on its side: it is a candidate on that side (its scope and, for a
// targetRef policy, its attachment aside: they only narrow it), its ports
// admit the flow's and both its ends match.
func (f *flow) mayMatch(n *index.Rule, src, dst resource.Tags) bool {
	if n.Sides&index.SideBits[f.side] == 0 || !index.MatchesPorts(n.Ports, f.proto, f.port) {
		return false
	}
	return (n.Src == nil || n.Src.Matches(src)) && (n.Dst == nil || n.Dst.Matches(dst))
}

func tagsOf(pairs []index.TagKV) resource.Tags {
	t := make(resource.Tags, len(pairs))
	for _, kv := range pairs {
		t[kv.K] = kv.V
	}
	return t
}

// beats reports whether o, matching a flow with r and a candidate, keeps r
// from deciding it (docs/order.md, "Combining"): only such a rule can
// cover r.
func (j *judgement) beats(o, r *index.Rule) bool {
	if j.st.set.Combine == resource.DenyOverrides && o.Action != r.Action {
		return o.Action == resource.Deny
	}
	return o.Key.Less(&r.Key)
}

// index returns the tracker's rule index brought to st: updated in place
// from base by the changed policies, or built anew.
func (j *judgement) index(changed []string) *ruleIndex {
	tp := j.tp
	if tp.ix == nil || tp.ixOf != j.base {
		tp.ix = newRuleIndex()
		j.b.Range(func(_ string, ps *pstate) bool {
			tp.ix.addPolicy(ps)
			return true
		})
		tp.ixOf = j.st
		return tp.ix
	}
	for _, name := range changed {
		if old, ok := j.base.policies.Get(name); ok {
			tp.ix.removePolicy(old)
		}
		if ps, ok := j.fresh[name]; ok {
			tp.ix.addPolicy(ps)
		}
	}
	tp.ixOf = j.st
	return tp.ix
}

// lintAll lints every rule of the partition.
func (j *judgement) lintAll() error {
	all := map[string]bool{}
	j.b.Range(func(name string, ps *pstate) bool {
		all[name] = true
		return true
	})
	ans, err := analysis.Lint(j.s, &analysis.LintRequest{Mesh: j.st.mesh, Type: j.st.typ, Budget: j.budget, ShadowedOf: all})
	if err != nil {
		return err
	}
	j.record(ans, all)
	return nil
}

// record sets the shadowed rules of the policies in only from lint's
// findings.
func (j *judgement) record(ans *analysis.LintAnswer, only map[string]bool) {
	found := map[string]map[string]string{}
	covers := map[string]map[string][]string{}
	decided := map[string]map[string]*flow{}
	unproven := map[string]bool{}
	for i := range ans.Decided {
		d := &ans.Decided[i]
		if !only[d.Policy] {
			continue
		}
		if decided[d.Policy] == nil {
			decided[d.Policy] = map[string]*flow{}
		}
		decided[d.Policy][d.Rule] = newFlow(d)
	}
	for _, u := range ans.Unproven {
		if u.Kind == analysis.FindingShadowed && u.Mesh == j.st.mesh && u.Type == j.st.typ && only[u.Policy] {
			unproven[u.Policy] = true
		}
	}
	for i := range ans.Findings {
		f := &ans.Findings[i]
		if f.Kind != analysis.FindingShadowed || f.Mesh != j.st.mesh || f.Type != j.st.typ || !only[f.Policy] {
			continue
		}
		if found[f.Policy] == nil {
			found[f.Policy] = map[string]string{}
			covers[f.Policy] = map[string][]string{}
		}
		found[f.Policy][f.Rule] = f.Message
		var names []string
		for _, r := range f.Related {
			if !slices.Contains(names, r.Policy) {
				names = append(names, r.Policy)
			}
		}
		covers[f.Policy][f.Rule] = names
	}
	for name := range only {
		old, ok := j.b.Get(name)
		if !ok || !old.judging() {
			continue
		}
		ps := j.edit(name) // its flows and covers at least are new
		ps.shadowed, ps.unproven, ps.covers, ps.decided = found[name], unproven[name], covers[name], decided[name]
	}
}

// unproven reports whether lint left a rule of the policy unsettled: its
// judgement may then depend on more than its covers (a key's value classes
// are cut by every selector of the partition), so any overlapping change
// judges it again.
func (j *judgement) unproven(name string) bool {
	ps, ok := j.b.Get(name)
	return ok && ps.unproven
}

// ruleIndex finds the enforced rules of a partition that may overlap a
// rule, by the exact tags each end requires. A tracker keeps one per
// partition and updates it in place with each change.
type ruleIndex struct {
	rules    map[*index.Rule]struct{}
	policies int
	keys     map[endKey]*keyRules
}

type endKey struct {
	end int
	key string
}

// keyRules are the rules that require a value of one key on one end, by
// value, and those that do not (lacking).
type keyRules struct {
	byValue map[string]map[*index.Rule]struct{}
	lacking map[*index.Rule]struct{}
}

func newRuleIndex() *ruleIndex {
	return &ruleIndex{rules: map[*index.Rule]struct{}{}, keys: map[endKey]*keyRules{}}
}

func (ix *ruleIndex) addPolicy(ps *pstate) {
	if !ps.judging() {
		return
	}
	ix.policies++
	for _, r := range ps.rules {
		if r.Audit {
			continue
		}
		ix.rules[r] = struct{}{}
		for k, kr := range ix.keys {
			kr.add(k, r)
		}
	}
}

func (ix *ruleIndex) removePolicy(ps *pstate) {
	if !ps.judging() {
		return
	}
	ix.policies--
	for _, r := range ps.rules {
		if r.Audit {
			continue
		}
		delete(ix.rules, r)
		for k, kr := range ix.keys {
			if v, ok := exactValue(endMatcher(r, k.end), k.key); ok {
				delete(kr.byValue[v], r)
				if len(kr.byValue[v]) == 0 {
					delete(kr.byValue, v)
				}
			} else {
				delete(kr.lacking, r)
			}
		}
	}
}

func (kr *keyRules) add(k endKey, r *index.Rule) {
	if v, ok := exactValue(endMatcher(r, k.end), k.key); ok {
		set := kr.byValue[v]
		if set == nil {
			set = map[*index.Rule]struct{}{}
			kr.byValue[v] = set
		}
		set[r] = struct{}{}
		return
	}
	kr.lacking[r] = struct{}{}
}

func endMatcher(r *index.Rule, end int) *index.Matcher {
	if end == 0 {
		return r.Src
	}
	return r.Dst
}

// prebuild builds the keyed rules of every key an end of a rule requires.
func (ix *ruleIndex) prebuild() {
	keys := map[endKey]bool{}
	for r := range ix.rules {
		for end := 0; end < 2; end++ {
			if m := endMatcher(r, end); m != nil {
				for _, kv := range m.Exact {
					keys[endKey{end, kv.K}] = true
				}
			}
		}
	}
	for k := range keys {
		ix.keyed(k)
	}
}

// keyed returns the rules by their required value of one key on one end,
// built on the first ask.
func (ix *ruleIndex) keyed(k endKey) *keyRules {
	if kr, ok := ix.keys[k]; ok {
		return kr
	}
	kr := &keyRules{byValue: map[string]map[*index.Rule]struct{}{}, lacking: map[*index.Rule]struct{}{}}
	for r := range ix.rules {
		kr.add(k, r)
	}
	ix.keys[k] = kr
	return kr
}

func exactValue(m *index.Matcher, key string) (string, bool) {
	if m == nil {
		return "", false
	}
	for _, kv := range m.Exact {
		if kv.K == key {
			return kv.V, true
		}
	}
	return "", false
}

// meeting lists the rules other than r that may overlap it.
func (ix *ruleIndex) meeting(r *index.Rule) []*index.Rule {
	var sets []map[*index.Rule]struct{}
	n := -1
	for end := 0; end < 2; end++ {
		m := endMatcher(r, end)
		if m == nil {
			continue
		}
		for _, kv := range m.Exact {
			kr := ix.keyed(endKey{end, kv.K})
			if c := len(kr.byValue[kv.V]) + len(kr.lacking); n < 0 || c < n {
				n = c
				sets = []map[*index.Rule]struct{}{kr.byValue[kv.V], kr.lacking}
			}
		}
	}
	if n < 0 {
		sets = []map[*index.Rule]struct{}{ix.rules}
	}
	var out []*index.Rule
	for _, set := range sets {
		for o := range set {
			if o != r && mayMeet(r, o) {
				out = append(out, o)
			}
		}
	}
	return out
}

// mayMeet reports whether two rules may match one flow: false only when
// they are candidates on no common side, or an end requires two different
// values of one key.
func mayMeet(a, b *index.Rule) bool {
	if a.Sides&b.Sides == 0 {
		return false
	}
	return !exactClash(a.Src, b.Src) && !exactClash(a.Dst, b.Dst)
}

func exactClash(a, b *index.Matcher) bool {
	if a == nil || b == nil {
		return false
	}
	for _, x := range a.Exact {
		for _, y := range b.Exact {
			if x.K == y.K && x.V != y.V {
				return true
			}
		}
	}
	return false
}

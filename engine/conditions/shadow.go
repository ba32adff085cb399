package conditions

// Shadowed rules, judged by lint (docs/lint.md), and judged again after a
// change only where the change can move them. Whether a rule R is shadowed
// depends on the frame (scopes, settings, applicable sides) and on the
// rules that may match a flow together with R and beat it: its covers. A
// change of policy P moves the covers only of the rules that overlap a rule
// P had or has. So those rules are linted again, in a world of their own
// policies and every policy with a rule that overlaps one of theirs — a
// world that holds all their covers, where lint answers for them exactly as
// over the whole partition. "Overlap" here is a quick test that may say yes
// for two rules that never meet (more work, never a wrong answer) and says
// no only when a tag both ends require differs.

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// judgeShadowed fills ps.shadowed for the policies whose covers may have
// changed since base (every policy when the frame changed).
func (st *state) judgeShadowed(s *engine.Snapshot, p *engine.Partition, base *state, frame bool, changed []string, budget int) error {
	if p.Rules(false) == nil {
		return nil
	}
	if !frame {
		return st.lintAll(s, budget)
	}
	if len(changed) == 0 {
		return nil
	}
	ix := newRuleIndex(st)
	// The seeds: every enforced rule a changed policy had or has.
	var seeds []*index.Rule
	for _, name := range changed {
		if old, ok := base.policies[name]; ok {
			seeds = append(seeds, old.enforcedRules()...)
		}
		if ps, ok := st.policies[name]; ok {
			seeds = append(seeds, ps.enforcedRules()...)
		}
	}
	// The affected policies: the changed ones, and the owners of the rules
	// that overlap a seed.
	affected := map[string]bool{}
	for _, name := range changed {
		if ps, ok := st.policies[name]; ok && ps.judging() {
			affected[name] = true
		}
	}
	for _, r := range seeds {
		for _, i := range ix.meeting(r) {
			affected[ix.rules[i].Policy.Name] = true
		}
	}
	if len(affected) == 0 {
		return nil
	}
	// The world: the affected policies and the owners of every rule that
	// overlaps one of theirs (all their covers among them).
	world := map[string]bool{}
	for name := range affected {
		world[name] = true
		for _, r := range st.policies[name].enforcedRules() {
			for _, i := range ix.meeting(r) {
				world[ix.rules[i].Policy.Name] = true
			}
		}
	}
	if 2*len(world) > ix.policies {
		return st.lintAll(s, budget)
	}
	res := make([]resource.Resource, 0, len(world)+len(st.scopes)+1)
	if st.meshDoc != nil {
		res = append(res, st.meshDoc)
	}
	for _, sc := range st.scopes {
		res = append(res, sc)
	}
	for name := range world {
		res = append(res, st.policies[name].doc)
	}
	sub := engine.Build(st.rev, res)
	sp, err := sub.Partition(st.mesh, st.typ)
	if err != nil || sp.Closed() || sp.NotApplicable(0) != st.notApp[0] || sp.NotApplicable(1) != st.notApp[1] {
		// The smaller world differs in more than its rules: judge the whole.
		return st.lintAll(s, budget)
	}
	ans, err := analysis.Lint(sub, &analysis.LintRequest{Mesh: st.mesh, Type: st.typ, Budget: budget})
	if err != nil {
		return err
	}
	for name := range affected {
		st.policies[name].shadowed = nil
	}
	st.record(ans, affected)
	return nil
}

// lintAll lints the whole partition.
func (st *state) lintAll(s *engine.Snapshot, budget int) error {
	ans, err := analysis.Lint(s, &analysis.LintRequest{Mesh: st.mesh, Type: st.typ, Budget: budget})
	if err != nil {
		return err
	}
	for _, ps := range st.policies {
		ps.shadowed = nil
	}
	st.record(ans, nil)
	return nil
}

// record keeps the shadowed findings of the policies in only (nil: every
// policy).
func (st *state) record(ans *analysis.LintAnswer, only map[string]bool) {
	for i := range ans.Findings {
		f := &ans.Findings[i]
		if f.Kind != analysis.FindingShadowed || f.Mesh != st.mesh || f.Type != st.typ || only != nil && !only[f.Policy] {
			continue
		}
		ps, ok := st.policies[f.Policy]
		if !ok || !ps.judging() {
			continue
		}
		if ps.shadowed == nil {
			ps.shadowed = map[string]string{}
		}
		ps.shadowed[f.Rule] = f.Message
	}
}

// ruleIndex finds the enforced rules of a partition that may overlap a
// rule, by the exact tags each end requires.
type ruleIndex struct {
	rules    []*index.Rule
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
	byValue map[string][]int32
	lacking []int32
}

func newRuleIndex(st *state) *ruleIndex {
	ix := &ruleIndex{keys: map[endKey]*keyRules{}}
	for _, ps := range st.policies {
		if !ps.judging() {
			continue
		}
		ix.policies++
		ix.rules = append(ix.rules, ps.enforcedRules()...)
	}
	return ix
}

func endMatcher(r *index.Rule, end int) *index.Matcher {
	if end == 0 {
		return r.Src
	}
	return r.Dst
}

// keyed returns the rules by their required value of one key on one end,
// built on the first ask.
func (ix *ruleIndex) keyed(k endKey) *keyRules {
	if kr, ok := ix.keys[k]; ok {
		return kr
	}
	kr := &keyRules{byValue: map[string][]int32{}}
	for i, r := range ix.rules {
		if v, ok := exactValue(endMatcher(r, k.end), k.key); ok {
			kr.byValue[v] = append(kr.byValue[v], int32(i))
		} else {
			kr.lacking = append(kr.lacking, int32(i))
		}
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
func (ix *ruleIndex) meeting(r *index.Rule) []int32 {
	var best []int32
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
				best = append(append(best[:0:0], kr.byValue[kv.V]...), kr.lacking...)
			}
		}
	}
	if n < 0 {
		best = make([]int32, len(ix.rules))
		for i := range best {
			best[i] = int32(i)
		}
	}
	out := best[:0]
	for _, i := range best {
		if o := ix.rules[i]; o != r && mayMeet(r, o) {
			out = append(out, i)
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

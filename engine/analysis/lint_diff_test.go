package analysis_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/internal/worldgen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Lint is held to brute force on small random worlds (genWorld's scopes,
// settings and selectors, each policy cut to one rule so that removing the
// rule is deleting the policy): every rule is settled one way or the other
// or counted as unproven, and each side of each answer is checked with
// Decide —
//   - shadowed: no flow is decided by the rule, over flows whose tag sets
//     are drawn from lint's value classes (every key, every class);
//   - not shadowed: the flow lint gives is decided by the rule;
//   - redundant: deleting the policy changes no answer (the final action,
//     each side's action and conf) on any of those flows;
//   - not redundant: deleting it changes the answer of the flow lint gives.

// singleRule cuts every policy to one rule: one source and one destination,
// or one from or to item.
func singleRule(c *worldgen.Choices, res []resource.Resource) []resource.Resource {
	for _, r := range res {
		p, ok := r.(*resource.Policy)
		if !ok {
			continue
		}
		if p.TargetRef == nil {
			p.Sources, p.Destinations = p.Sources[:1], p.Destinations[:1]
			continue
		}
		switch {
		case len(p.From) > 0 && (len(p.To) == 0 || c.Chance(50)):
			p.From, p.To = p.From[:1], nil
		case len(p.To) > 0:
			p.From, p.To = nil, p.To[:1]
		}
	}
	return res
}

// answerOf is what removing a rule must not change.
type answerOf struct {
	action, out, in resource.Action
	outConf, inConf resource.Object
}

func answerAt(d engine.Decision) answerOf {
	norm := func(o resource.Object) resource.Object {
		if len(o) == 0 {
			return nil
		}
		return o
	}
	return answerOf{d.Action, d.Outbound.Action, d.Inbound.Action, norm(d.Outbound.Conf), norm(d.Inbound.Conf)}
}

type lintStats struct {
	rules, shadowed, redundant, ties, unprovenShadow, unprovenRedundant, flows int

	why map[string]int // unproven, by kind and reason
}

func TestLintAgainstBruteForce(t *testing.T) {
	t.Parallel()
	worlds := 250
	if testing.Short() {
		worlds = 50
	}
	st := lintStats{why: map[string]int{}}
	for seed := 0; seed < worlds; seed++ {
		c := worldgen.NewChoices([]byte(fmt.Sprintf("lint-%d", seed)))
		res := singleRule(c, worldgen.World(c))
		s := engine.Build(1, res)
		for _, typ := range []string{"TrafficPermission", "MeshTrafficPermission"} {
			checkLint(t, c, s, res, typ, &st)
		}
	}
	t.Logf("%d rules: %d shadowed, %d redundant, %d ties; unproven: %d shadowed, %d redundant; %d flows decided",
		st.rules, st.shadowed, st.redundant, st.ties, st.unprovenShadow, st.unprovenRedundant, st.flows)
	t.Logf("unproven by reason: %v", st.why)
	if st.shadowed == 0 || st.redundant == 0 {
		t.Fatalf("the worlds found nothing to check: %+v", st)
	}
}

func checkLint(t *testing.T, c *worldgen.Choices, s *engine.Snapshot, res []resource.Resource, typ string, st *lintStats) {
	t.Helper()
	ans, proofs, err := analysis.LintWithProofs(s, analysis.LintRequest{Mesh: "m", Type: typ})
	if err != nil {
		return // the type is not known in this world
	}
	for _, n := range ans.Notes {
		_ = n
		return // PerDestination, or closed: not analyzed
	}
	invalid := map[string]bool{}
	for _, ir := range s.Invalid() {
		invalid[ir.Key.Name] = true
	}
	type ruleKey struct{ policy, rule string }
	var policies []*resource.Policy
	want := map[ruleKey]*resource.Policy{}
	for _, r := range res {
		if p, ok := r.(*resource.Policy); ok && p.Type == typ && !invalid[p.Name] {
			id := "sources[0]/destinations[0]"
			switch {
			case len(p.From) > 0:
				id = "from[0]"
			case len(p.To) > 0:
				id = "to[0]"
			case p.TargetRef != nil:
				continue // no rule
			}
			policies = append(policies, p)
			want[ruleKey{p.Name, id}] = p
		}
	}
	shadowed, redundant := map[ruleKey]bool{}, map[ruleKey]bool{}
	for _, f := range ans.Findings {
		k := ruleKey{f.Policy, f.Rule}
		switch f.Kind {
		case analysis.FindingShadowed:
			shadowed[k] = true
			st.shadowed++
		case analysis.FindingRedundant:
			redundant[k] = true
			st.redundant++
		case analysis.FindingConflictingTie:
			st.ties++
		}
	}
	unShadow, unRedundant := map[ruleKey]bool{}, map[ruleKey]bool{}
	for _, u := range ans.Unproven {
		k := ruleKey{u.Policy, u.Rule}
		st.why[u.Kind.String()+": "+u.Why]++
		if u.Kind == analysis.FindingShadowed {
			unShadow[k] = true
			st.unprovenShadow++
		} else {
			unRedundant[k] = true
			st.unprovenRedundant++
		}
	}
	decides, changes := map[ruleKey]analysis.LintProof{}, map[ruleKey]analysis.LintProof{}
	for _, p := range proofs {
		if p.What == "decides" {
			decides[ruleKey{p.Policy, p.Rule}] = p
		} else {
			changes[ruleKey{p.Policy, p.Rule}] = p
		}
	}
	after := map[string]*engine.Snapshot{}
	for _, p := range policies {
		after[p.Name] = s.Apply(2, []engine.Change{engine.Delete(p.Key())})
	}
	decide := func(snap *engine.Snapshot, src, dst resource.Tags, proto resource.Protocol, port uint32) engine.Decision {
		st.flows++
		d, err := snap.Decide(&engine.Request{Mesh: "m", Type: typ, Source: src, Destination: dst, Protocol: proto, Port: port, NoCache: true})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		return d
	}
	byRule := func(d engine.Decision, k ruleKey) bool {
		for _, sd := range []engine.SideDecision{d.Outbound, d.Inbound} {
			if sd.Reason == engine.ReasonMatched && sd.Policy == k.policy && sd.Rule == k.rule {
				return true
			}
		}
		return false
	}
	// Every rule is settled one way or the other, or unproven.
	for k := range want {
		st.rules++
		_, d := decides[k]
		if n := btoi(shadowed[k]) + btoi(d) + btoi(unShadow[k]); n != 1 {
			t.Fatalf("%s %v: shadowed %v, decides-proof %v, unproven %v\n%s", typ, k, shadowed[k], d, unShadow[k], worldgen.Describe(res))
		}
		if !d {
			continue
		}
		_, ch := changes[k]
		if n := btoi(redundant[k]) + btoi(ch) + btoi(unRedundant[k]); n != 1 {
			t.Fatalf("%s %v: redundant %v, changes-proof %v, unproven %v\n%s", typ, k, redundant[k], ch, unRedundant[k], worldgen.Describe(res))
		}
	}
	// The proofs hold.
	for k, p := range decides {
		if d := decide(s, p.Source, p.Destination, p.Protocol, p.Port); !byRule(d, k) {
			t.Fatalf("%s %v: lint says it decides %v -> %v %v %d; Decide: %+v\n%s", typ, k, p.Source, p.Destination, p.Protocol, p.Port, d, worldgen.Describe(res))
		}
	}
	for k, p := range changes {
		a, b := decide(s, p.Source, p.Destination, p.Protocol, p.Port), decide(after[k.policy], p.Source, p.Destination, p.Protocol, p.Port)
		if reflect.DeepEqual(answerAt(a), answerAt(b)) {
			t.Fatalf("%s %v: lint says removing it changes %v -> %v %v %d; it does not: %+v\n%s", typ, k, p.Source, p.Destination, p.Protocol, p.Port, a, worldgen.Describe(res))
		}
	}
	// The findings hold over flows drawn from the value classes.
	keys, ports := analysis.LintClasses(s, "m", typ)
	draw := func() resource.Tags {
		tags := resource.Tags{}
		for k, reps := range keys {
			if v := reps[c.N(len(reps))]; v != "" {
				tags[k] = v
			}
		}
		return tags
	}
	for i := 0; i < 400; i++ {
		src, dst, pc := draw(), draw(), ports[c.N(len(ports))]
		d := decide(s, src, dst, pc.Protocol, pc.Port)
		for k := range want {
			if shadowed[k] && byRule(d, k) {
				t.Fatalf("%s %v: lint says shadowed; Decide %v -> %v %v %d: %+v\n%s", typ, k, src, dst, pc.Protocol, pc.Port, d, worldgen.Describe(res))
			}
			if redundant[k] {
				if b := decide(after[k.policy], src, dst, pc.Protocol, pc.Port); !reflect.DeepEqual(answerAt(d), answerAt(b)) {
					t.Fatalf("%s %v: lint says redundant; removing it changes %v -> %v %v %d: %+v vs %+v\n%s", typ, k, src, dst, pc.Protocol, pc.Port, d, b, worldgen.Describe(res))
				}
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

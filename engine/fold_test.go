package engine_test

// A naive reference of Resolve's fold (docs/resolve.md), written from the text: the
// policies attached to the workload, ordered as Decide orders their first
// matching rule (blocks policies that tie before the tie-break: newer first),
// Default ones then Absolute ones in reverse, merged one by one into a result
// that starts empty. It is compared with Snapshot.Resolve on random policy sets.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

type refEntry struct {
	p     *resource.Policy
	first *refRule // the first matching rule (S&D); nil for targetRef
	level int
}

func refResolve(resources []resource.Resource, req engine.ResolveRequest) (rules resource.Object, from map[string]string, status map[string]string) {
	w := refLoad(resources, "m", req.Type)
	_, _, tb, io, _ := w.settings(req.Type)
	workload := req.Destination
	if workload == nil {
		workload = req.Source
	}
	var entries []refEntry
	for _, p := range w.policies {
		if p.TargetRef != nil {
			if refSelects(refTarget(*p.TargetRef), workload) {
				entries = append(entries, refEntry{p: p, level: refLevel(*p.TargetRef, w.profile())})
			}
			continue
		}
		var first *refRule
		for _, r := range w.rules(req.Type) {
			if r.policy != p || (r.scope != nil && !w.member(r.scope, workload)) {
				continue
			}
			if !refPorts(p.Ports, req.Protocol, req.Port) || !refSelects(r.src, req.Source) || !refSelects(r.dst, req.Destination) {
				continue
			}
			if first == nil || w.before(r, first, tb, io) {
				first = r
			}
		}
		if first != nil {
			entries = append(entries, refEntry{p: p, first: first})
		}
	}
	key := func(e refEntry) *refRule {
		if e.first != nil {
			return e.first
		}
		phase := 1
		if e.p.Rank == resource.RankAbsolute {
			phase = 0
		}
		return &refRule{policy: e.p, phase: phase, priority: e.p.Priority, total: e.level}
	}
	hasBlocks := func(p *resource.Policy) bool { return p.Defaults != nil || p.Overrides != nil }
	// Decide's order first.
	sort.SliceStable(entries, func(i, j int) bool { return w.before(key(entries[i]), key(entries[j]), tb, io) })
	// Then, among policies that tie before the tie-break, the ones with blocks
	// take the places of the ones with blocks, newer first, then by name.
	tied := func(a, b *refRule) bool {
		return a.phase == b.phase && w.position(a.scope) == w.position(b.scope) && a.priority == b.priority &&
			a.total == b.total && a.exact == b.exact
	}
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && tied(key(entries[i]), key(entries[j])) {
			j++
		}
		var places []int
		var withBlocks []refEntry
		for k := i; k < j; k++ {
			if hasBlocks(entries[k].p) {
				places = append(places, k)
				withBlocks = append(withBlocks, entries[k])
			}
		}
		sort.SliceStable(withBlocks, func(x, y int) bool {
			a, b := withBlocks[x].p, withBlocks[y].p
			if c := refNewer(0, 0, a.Meta.CreationTime.UnixNano(), b.Meta.CreationTime.UnixNano(),
				a.Meta.CreationTime.IsZero(), b.Meta.CreationTime.IsZero()); c != 0 {
				return c > 0
			}
			return a.Name < b.Name
		})
		for k, place := range places {
			entries[place] = withBlocks[k]
		}
		i = j
	}
	var order []*resource.Policy
	for _, e := range entries {
		if e.p.Rank != resource.RankAbsolute {
			order = append(order, e.p)
		}
	}
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].p.Rank == resource.RankAbsolute {
			order = append(order, entries[i].p)
		}
	}
	result, by := map[string]any{}, map[string]string{}
	unset := map[string]bool{}
	declared := map[string][]string{}
	for _, p := range order {
		defaults, overrides := p.Defaults, p.Overrides
		if p.Conf != nil && !hasBlocks(p) {
			b := &resource.Block{Rules: p.Conf}
			if p.Rank == resource.RankAbsolute {
				overrides = b
			} else {
				defaults = b
			}
		}
		for _, b := range []*resource.Block{defaults, overrides} {
			if b != nil {
				for k := range b.Rules {
					declared[p.Name] = append(declared[p.Name], k)
				}
			}
		}
		if defaults != nil && refWhen(defaults.When, result) {
			kept := map[string]any{}
			for k, v := range defaults.Rules {
				if !unset[k] {
					kept[k] = v
				}
			}
			if len(result) == 0 {
				for k, v := range kept {
					result[k], by[k] = v, p.Name
				}
			} else if defaults.Strategy == resource.Merge {
				for k, v := range kept {
					if _, ok := result[k]; !ok {
						result[k], by[k] = v, p.Name
					}
				}
			}
		}
		if overrides != nil && refWhen(overrides.When, result) {
			if overrides.Strategy == resource.Atomic {
				result, by = map[string]any{}, map[string]string{}
			}
			for k, v := range overrides.Rules {
				result[k], by[k] = v, p.Name
			}
		}
		for _, u := range p.Unset {
			unset[u] = true
		}
	}
	status = map[string]string{}
	for name, keys := range declared {
		kept := 0
		seen := map[string]bool{}
		n := 0
		for _, k := range keys {
			if seen[k] {
				continue
			}
			seen[k] = true
			n++
			if by[k] == name {
				kept++
			}
		}
		switch {
		case kept == n:
			status[name] = "Enforced"
		case kept == 0:
			status[name] = "Overridden"
		default:
			status[name] = "PartiallyEnforced"
		}
	}
	return result, by, status
}

// refWhen evaluates the few when expressions the generator writes, by hand.
func refWhen(expr string, result map[string]any) bool {
	switch expr {
	case "":
		return true
	case "size(self.rules) > 0":
		return len(result) > 0
	case `"a" in self.rules`:
		_, ok := result["a"]
		return ok
	case `!("b" in self.rules)`:
		_, ok := result["b"]
		return !ok
	case `"a" in self.rules && self.rules["a"] == "x"`:
		return result["a"] == "x"
	}
	panic("unknown when: " + expr)
}

var foldWhens = []string{"", "", "", "size(self.rules) > 0", `"a" in self.rules`, `!("b" in self.rules)`,
	`"a" in self.rules && self.rules["a"] == "x"`}

func (c *choices) block() *resource.Block {
	b := &resource.Block{Strategy: resource.Strategy(c.n(2)), When: foldWhens[c.n(len(foldWhens))], Rules: resource.Object{}}
	for _, k := range []string{"a", "b", "c", "d"} {
		if c.chance(45) {
			b.Rules[k] = []string{"x", "y", "z"}[c.n(3)]
		}
	}
	return b
}

// genFoldWorld: a mesh with a few scopes, and policies of two types: "Cfg"
// (targetRef policies with blocks or bare conf) and "SdCfg" (S&D policies).
func genFoldWorld(c *choices) []resource.Resource {
	// both types declared: a world without policies of one still knows it
	out := []resource.Resource{&resource.Mesh{Name: "m", TieBreak: resource.TieBreak(c.n(4)), Profile: resource.Profile(c.n(3)),
		Types: map[string]resource.TypeSettings{"Cfg": {}, "SdCfg": {}}}}
	var scopes []string
	for i, n := 0, c.n(3); i < n; i++ {
		s := &resource.Scope{Mesh: "m", Name: fmt.Sprintf("s%d", i), Priority: int32(c.n(3)), Enforced: true,
			Selectors: []resource.Selector{c.selector()}}
		if len(scopes) > 0 && c.chance(40) {
			s.Parent = scopes[c.n(len(scopes))]
		}
		scopes = append(scopes, s.Name)
		out = append(out, s)
	}
	fill := func(p *resource.Policy) {
		if c.chance(20) {
			p.Rank = resource.RankAbsolute
		}
		p.Priority = int32(c.n(2))
		switch c.n(4) {
		case 0:
			p.Conf = c.block().Rules
			if len(p.Conf) == 0 {
				p.Conf = resource.Object{"a": "x"}
			}
		default:
			if c.chance(70) {
				p.Defaults = c.block()
			}
			if c.chance(50) || p.Defaults == nil {
				p.Overrides = c.block()
			}
		}
		if c.chance(30) {
			p.Unset = []string{[]string{"a", "b", "c"}[c.n(3)]}
		}
		p.Meta.CreationTime = genTimes[c.n(3)]
		p.Meta.ModificationTime = genTimes[c.n(3)]
	}
	for i, n := 0, c.n(6); i < n; i++ {
		p := &resource.Policy{Mesh: "m", Name: fmt.Sprintf("c%d", i), Type: "Cfg"}
		tr := c.targetRef()
		p.TargetRef = &tr
		fill(p)
		out = append(out, p)
	}
	for i, n := 0, c.n(6); i < n; i++ {
		p := &resource.Policy{Mesh: "m", Name: fmt.Sprintf("d%d", i), Type: "SdCfg",
			Sources: []resource.Selector{c.selector()}, Destinations: []resource.Selector{c.selector()}}
		if len(scopes) > 0 && c.chance(50) {
			p.Scope = scopes[c.n(len(scopes))]
		}
		fill(p)
		out = append(out, p)
	}
	return out
}

func checkFold(t *testing.T, data []byte) {
	c := newChoices(data)
	resources := genFoldWorld(c)
	for i, r := range resources {
		b, _ := resource.EncodeJSON(r)
		back, err := resource.DecodeJSON(b)
		if err != nil {
			t.Fatalf("generated resource does not decode: %v\n%s", err, b)
		}
		resources[i] = back.WithMeta(r.Metadata())
	}
	snap := engine.Build(1, resources)
	for i := 0; i < 20; i++ {
		req := engine.ResolveRequest{Mesh: "m", Type: []string{"Cfg", "SdCfg"}[c.n(2)], Source: c.tags(), Destination: c.tags()}
		if req.Type == "Cfg" && c.chance(30) {
			req.Destination = nil
		}
		res, err := snap.Resolve(&req)
		if err != nil {
			t.Fatalf("Resolve(%+v): %v", req, err)
		}
		wantRules, wantFrom, wantStatus := refResolve(resources, req)
		gotFrom := map[string]string{}
		for _, r := range res.Main.Rules {
			gotFrom[r.Name] = r.Policy
		}
		gotStatus := map[string]string{}
		for k, v := range res.Main.StatusMap() {
			gotStatus[k] = v.(string)
		}
		if !reflect.DeepEqual(map[string]any(res.Main.RuleValues()), wantRules) || !reflect.DeepEqual(gotFrom, wantFrom) ||
			!reflect.DeepEqual(gotStatus, wantStatus) {
			t.Fatalf("Resolve differs from the reference\nrequest %+v\nengine:    rules %v from %v status %v\nreference: rules %v from %v status %v%s",
				req, res.Main.RuleValues(), gotFrom, gotStatus, wantRules, wantFrom, wantStatus, describe(resources))
		}
	}
}

func TestResolveMatchesReference(t *testing.T) {
	t.Parallel()
	n := 2000
	if testing.Short() {
		n = 200
	}
	for i := 0; i < n; i++ {
		checkFold(t, seedBytes(2_000_000+i))
	}
}

func FuzzResolveMatchesReference(f *testing.F) {
	for i := 0; i < 10; i++ {
		f.Add(seedBytes(3_000_000 + i))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFold(t, data)
	})
}

// TestWhenFailureIsReported: a when expression that fails at run time skips its
// block and says why; it never panics.
func TestWhenFailureIsReported(t *testing.T) {
	t.Parallel()
	docs := `
{kind: Policy, mesh: m, name: gw, type: Cfg, targetRef: {kind: Mesh},
 overrides: {strategy: merge, when: 'self.rules["a"] > 5.0', rules: {a: 5}}}
---
{kind: Policy, mesh: m, name: route, type: Cfg, targetRef: {kind: Service, name: web}, conf: {a: text}}
---
{kind: Policy, mesh: m, name: loop, type: Cfg, targetRef: {kind: MeshSubset, tags: {x: y}},
 defaults: {when: '[1,2,3,4,5,6,7,8,9,10].all(i, [1,2,3,4,5,6,7,8,9,10].all(j, [1,2,3,4,5,6,7,8,9,10].all(k, [1,2,3,4,5,6,7,8,9,10].all(l, i+j+k+l > 0))))', rules: {b: 1}}}
`
	rs, err := resource.DecodeYAML([]byte(docs))
	if err != nil {
		t.Fatal(err)
	}
	snap := engine.Build(1, rs)
	res, err := snap.Resolve(&engine.ResolveRequest{Mesh: "m", Type: "Cfg", Destination: resource.Tags{"kuma.io/service": "web", "x": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	got := res.Main.RuleValues()
	if !reflect.DeepEqual(got, resource.Object{"a": "text"}) {
		t.Fatalf("rules %v", got)
	}
	var skipped []string
	for _, st := range res.Main.Status {
		skipped = append(skipped, st.Skipped...)
	}
	want := 0
	for _, s := range skipped {
		if len(s) > 0 && (contains(s, "no such overload") || contains(s, "cost limit")) {
			want++
		}
	}
	if want != 2 {
		t.Fatalf("want the type error and the cost overrun reported, got %q", skipped)
	}
	_ = json.Number("")
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

package conditions_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/internal/worldgen"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The conditions a tracker carries from snapshot to snapshot are held to
// a fresh judgement of each snapshot and to brute force, on small random
// worlds (worldgen's scopes, settings, S&D and targetRef policies, every
// operator, ports) changed one policy at a time:
//   - carried and fresh agree on every policy, except where lint over the
//     whole partition leaves a rule unproven (the smaller world the
//     tracker lints may settle it);
//   - a policy called Shadowed decides no side of any flow drawn from
//     every key's named values, unnamed ones, prefixes and addresses;
//   - every shadowed finding of lint over the whole partition is a
//     Shadowed policy or a PartiallyEnforced one (never missed).

func TestCarriedConditionsAgainstBruteForce(t *testing.T) {
	t.Parallel()
	worlds := 150
	if testing.Short() {
		worlds = 40
	}
	var stats struct{ changes, shadowed, partial, flows, skipped int }
	for seed := 0; seed < worlds; seed++ {
		c := worldgen.NewChoices([]byte(fmt.Sprintf("conditions-%d", seed)))
		res := worldgen.World(c)
		s := engine.Build(1, res)
		tr := conditions.NewTracker()
		types := []string{"TrafficPermission", "MeshTrafficPermission"}
		for _, typ := range types {
			_, _ = tr.Partition(s, "m", typ)
		}
		for step := 0; step < 6; step++ {
			ch, ok := change(c, s, step)
			if !ok {
				continue
			}
			stats.changes++
			s = s.Apply(s.Revision()+1, []engine.Change{ch})
			for _, typ := range types {
				carried, err := tr.Partition(s, "m", typ)
				if err != nil {
					continue
				}
				fresh, err := conditions.NewTracker().Partition(s, "m", typ)
				if err != nil {
					t.Fatalf("fresh: %v", err)
				}
				ans, err := analysis.Lint(s, &analysis.LintRequest{Mesh: "m", Type: typ})
				if err != nil {
					t.Fatalf("lint: %v", err)
				}
				unproven := map[string]bool{}
				for _, u := range ans.Unproven {
					if u.Kind == analysis.FindingShadowed {
						unproven[u.Policy] = true
					}
				}
				for _, name := range fresh.Names() {
					a, _ := carried.Policy(name)
					b, _ := fresh.Policy(name)
					if names(a) != names(b) && !unproven[name] {
						t.Fatalf("seed %d step %d %s %s: carried %s, fresh %s\n%s", seed, step, typ, name, names(a), names(b), describe(s))
					}
					if names(a) != names(b) {
						stats.skipped++
					}
				}
				for i := range ans.Findings {
					f := &ans.Findings[i]
					if f.Kind != analysis.FindingShadowed {
						continue
					}
					cs, _ := carried.Policy(f.Policy)
					if !has(cs, conditions.Shadowed) && !has(cs, conditions.PartiallyEnforced) {
						t.Fatalf("seed %d step %d %s: lint finds %s %s shadowed; conditions %s\n%s", seed, step, typ, f.Policy, f.Rule, names(cs), describe(s))
					}
				}
				var shadowed []string
				for _, name := range carried.Names() {
					cs, _ := carried.Policy(name)
					switch {
					case has(cs, conditions.Shadowed):
						shadowed = append(shadowed, name)
						stats.shadowed++
					case has(cs, conditions.PartiallyEnforced):
						stats.partial++
					}
				}
				if len(shadowed) > 0 {
					stats.flows += bruteForce(t, c, s, typ, shadowed)
				}
			}
		}
	}
	t.Logf("%d changes: %d shadowed, %d partially enforced policies checked, %d flows; %d left to unproven rules",
		stats.changes, stats.shadowed, stats.partial, stats.flows, stats.skipped)
	if stats.shadowed == 0 {
		t.Fatal("the worlds found nothing shadowed to check")
	}
}

func has(cs []conditions.Condition, k conditions.Kind) bool {
	for _, c := range cs {
		if c.Kind == k {
			return true
		}
	}
	return false
}

func describe(s *engine.Snapshot) string {
	var res []resource.Resource
	s.Resources(func(e engine.Entry) bool {
		if e.Resource != nil {
			res = append(res, e.Resource)
		}
		return true
	})
	return worldgen.Describe(res)
}

// change makes one random change of one policy: a new rule set for an
// existing policy, its deletion, or a new policy.
func change(c *worldgen.Choices, s *engine.Snapshot, step int) (engine.Change, bool) {
	var policies []*resource.Policy
	s.Resources(func(e engine.Entry) bool {
		if p, ok := e.Resource.(*resource.Policy); ok {
			policies = append(policies, p)
		}
		return true
	})
	fresh := func() *resource.Policy {
		p := &resource.Policy{Mesh: "m", Name: fmt.Sprintf("n%d", step), Type: "TrafficPermission", Priority: int32(c.N(3)), Action: c.Action()}
		if c.Chance(25) {
			p.Rank = resource.RankAbsolute
		}
		for j, m := 0, 1+c.N(2); j < m; j++ {
			p.Sources = append(p.Sources, c.Selector())
		}
		for j, m := 0, 1+c.N(2); j < m; j++ {
			p.Destinations = append(p.Destinations, c.Selector())
		}
		if c.Chance(25) {
			p.Ports = []resource.PortEntry{{Protocol: resource.TCP, Ports: []string{"80", "22,8000-8100"}[c.N(2)]}}
		}
		return p
	}
	switch x := c.N(10); {
	case x < 4 && len(policies) > 0:
		old := policies[c.N(len(policies))]
		p := *old
		p.Meta.ModRevision = s.Revision() + 1
		if p.TargetRef != nil {
			p.From, p.To = nil, nil
			for j, m := 0, 1+c.N(2); j < m; j++ {
				p.From = append(p.From, resource.Item{TargetRef: c.TargetRef(), Action: c.Action().Or(resource.Allow)})
			}
		} else {
			n := fresh()
			p.Sources, p.Destinations, p.Action, p.Rank, p.Ports = n.Sources, n.Destinations, n.Action, n.Rank, n.Ports
		}
		return engine.Put(&p), true
	case x < 7 && len(policies) > 0:
		return engine.Delete(policies[c.N(len(policies))].Key()), true
	}
	return engine.Put(fresh()), true
}

// bruteForce decides flows drawn from every key's classes and fails when a
// policy called Shadowed decides a side of one; it returns the flows
// decided.
func bruteForce(t *testing.T, c *worldgen.Choices, s *engine.Snapshot, typ string, shadowed []string) int {
	t.Helper()
	values := map[string][]string{}
	for _, k := range worldgen.Keys {
		vs := append([]string{"", "zz"}, worldgen.Values[k]...)
		for _, v := range worldgen.Values[k] {
			vs = append(vs, v[:1]+"zz")
		}
		values[k] = vs
	}
	values["ip"] = append(values["ip"], "10.0.9.9", "10.0.1.77", "192.168.7.7", "8.8.8.8")
	values["principal"] = append([]string{"", "spiffe://m/other", "spiffe://x/web"}, worldgen.Values["principal"]...)
	draw := func() resource.Tags {
		t := resource.Tags{}
		for k, vs := range values {
			if v := vs[c.N(len(vs))]; v != "" {
				t[k] = v
			}
		}
		return t
	}
	protos := []resource.Protocol{resource.ProtocolAny, resource.TCP, resource.UDP, resource.ICMP}
	ports := []uint32{0, 80, 22, 8050, 9999}
	is := map[string]bool{}
	for _, n := range shadowed {
		is[n] = true
	}
	const flows = 300
	for i := 0; i < flows; i++ {
		req := &engine.Request{Mesh: "m", Type: typ, Source: draw(), Destination: draw(), Protocol: protos[c.N(len(protos))],
			Port: ports[c.N(len(ports))], NoCache: true}
		if req.Protocol == resource.ICMP || req.Protocol == resource.ProtocolAny {
			req.Port = 0
		}
		d, err := s.Decide(req)
		if err != nil {
			continue
		}
		for _, sd := range []engine.SideDecision{d.Outbound, d.Inbound} {
			if sd.Reason == engine.ReasonMatched && is[sd.Policy] {
				t.Fatalf("%s: %s is called Shadowed, yet decides %v -> %v %v %d: %+v\n%s", typ, sd.Policy,
					req.Source, req.Destination, req.Protocol, req.Port, d, describe(s))
			}
		}
	}
	return flows
}

// NoWorkloads carried through random inventory changes — workloads put,
// retagged, deleted, made invalid by an address an earlier one claims —
// and now and then a policy change, is held to a judgement from scratch of
// each snapshot: every valid workload against every rule's end (noWorkloads
// below, which shares no index with the tracker). The tracker judges some
// snapshots and skips others, so a judgement also carries several changes.
func TestCarriedNoWorkloadsAgainstFromScratch(t *testing.T) {
	t.Parallel()
	worlds := 200
	if testing.Short() {
		worlds = 50
	}
	types := []string{"TrafficPermission", "MeshTrafficPermission"}
	var stats struct{ judged, dead, alive int }
	for seed := 0; seed < worlds; seed++ {
		c := worldgen.NewChoices([]byte(fmt.Sprintf("noworkloads-%d", seed)))
		res := worldgen.World(c)
		for _, w := range worldgen.Inventory(c) {
			res = append(res, w.W)
		}
		s := engine.Build(1, res)
		tr := conditions.NewTracker()
		for step := 0; step < 12; step++ {
			var cs []engine.Change
			for i, n := 0, 1+c.N(3); i < n; i++ {
				cs = append(cs, workloadChange(c, s, step*4+i))
			}
			if c.Chance(15) {
				if ch, ok := change(c, s, step); ok {
					cs = append(cs, ch)
				}
			}
			s = s.Apply(s.Revision()+1, cs)
			if c.Chance(30) {
				continue // judged with the next change
			}
			for _, typ := range types {
				carried, err := tr.Partition(s, "m", typ)
				if err != nil {
					continue
				}
				want := noWorkloads(t, s, typ)
				stats.judged++
				for _, name := range carried.Names() {
					cs, _ := carried.Policy(name)
					if has(cs, conditions.NoWorkloads) != want[name] {
						t.Fatalf("seed %d step %d %s %s: carried %s, from scratch NoWorkloads %v\n%s", seed, step, typ, name,
							names(cs), want[name], describe(s))
					}
					if want[name] {
						stats.dead++
					} else {
						stats.alive++
					}
				}
			}
		}
	}
	t.Logf("%d judgements: %d policies with NoWorkloads, %d without", stats.judged, stats.dead, stats.alive)
	if stats.dead == 0 || stats.alive == 0 {
		t.Fatal("the worlds found no policy of one kind")
	}
}

// workloadChange puts a new workload, puts an existing one again with
// other tags, ports or addresses, or deletes one.
func workloadChange(c *worldgen.Choices, s *engine.Snapshot, n int) engine.Change {
	var have []*resource.Workload
	s.Resources(func(e engine.Entry) bool {
		if w, ok := e.Resource.(*resource.Workload); ok {
			have = append(have, w)
		}
		return true
	})
	if len(have) > 0 && c.Chance(35) {
		return engine.Delete(have[c.N(len(have))].Key())
	}
	tags := func() resource.Tags {
		t := c.Tags()
		delete(t, resource.IPTag)
		delete(t, resource.PrincipalTag)
		return t
	}
	w := &resource.Workload{Mesh: "m", Name: fmt.Sprintf("x%d", n), Tags: tags()}
	if len(have) > 0 && c.Chance(50) {
		w.Name = have[c.N(len(have))].Name
	}
	w.Meta.ModRevision = s.Revision() + 1
	for _, a := range worldgen.InvAddresses[:3] {
		if c.Chance(15) {
			w.Addresses = append(w.Addresses, a)
		}
	}
	for k := c.N(3); k > 0; k-- {
		p := resource.WorkloadPort{Port: []uint32{22, 80, 8080}[c.N(3)]}
		if c.Chance(80) {
			p.Tags = tags()
		}
		w.Ports = append(w.Ports, p)
	}
	return engine.Put(w)
}

// noWorkloads judges NoWorkloads from scratch: in a mesh with a valid
// workload, a valid policy none of whose ends selects a tag set a valid
// workload presents there (its own as a source; its own and each port's as
// a destination) that the end's scope holds; a targetRef policy without
// rules by its targetRef on the destination side.
func noWorkloads(t *testing.T, s *engine.Snapshot, typ string) map[string]bool {
	t.Helper()
	p, err := s.Partition("m", typ)
	if err != nil {
		t.Fatal(err)
	}
	var src, dst []resource.Tags
	if inv := p.Inventory(); inv != nil {
		inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
			if e.Err == "" {
				src = append(src, e.Workload.Tags)
				dst = append(dst, e.Workload.Tags)
				for _, pt := range e.Workload.Ports {
					dst = append(dst, e.Workload.ResolvedTags(pt.Port, ""))
				}
			}
			return true
		})
	}
	out := map[string]bool{}
	for pv := range p.Policies() {
		if pv.Err != "" || len(src) == 0 {
			continue
		}
		selects := false
		if len(pv.Rules) == 0 && pv.Doc.TargetRef != nil {
			m := index.CompileSelector(resource.TargetSelector(*pv.Doc.TargetRef))
			for _, tags := range dst {
				selects = selects || m.Matches(tags)
			}
		}
		for _, r := range pv.Rules {
			for side, sets := range [2][]resource.Tags{src, dst} {
				m := r.Src
				if side == 1 {
					m = r.Dst
				}
				for _, tags := range sets {
					if r.Sides&index.SideBits[side] != 0 && (m == nil || m.Matches(tags)) && p.MemberOf(r.Scope, tags) {
						selects = true
					}
				}
			}
		}
		out[pv.Doc.Name] = !selects
	}
	return out
}

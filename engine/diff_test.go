package engine_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// sameDecision compares every field Decide answers but the revision and the
// endpoints' resolution (the reference decides tags; endpoint_test.go tests
// resolution).
func sameDecision(a, b engine.Decision) bool {
	a.Revision, b.Revision, a.Explain, b.Explain = 0, 0, nil, nil
	a.SourceResolution, b.SourceResolution = inventory.EndpointResolution{}, inventory.EndpointResolution{}
	a.DestinationResolution, b.DestinationResolution = inventory.EndpointResolution{}, inventory.EndpointResolution{}
	return reflect.DeepEqual(a, b)
}

func checkAgainstReference(t *testing.T, data []byte) {
	c := newChoices(data)
	resources := genWorld(c)
	// Round-trip every resource through its document: what is generated must be
	// what the decoder accepts.
	for i, r := range resources {
		b, err := resource.EncodeJSON(r)
		if err != nil {
			t.Fatalf("encode %v: %v", r.Key(), err)
		}
		back, err := resource.DecodeJSON(b)
		if err != nil {
			t.Fatalf("generated resource does not decode: %v\n%s", err, b)
		}
		resources[i] = back.WithMeta(r.Metadata())
	}
	snap := engine.Build(1, resources)
	if inv := snap.Invalid(); len(inv) > 0 {
		// Only parents can be invalid here (generated parents exist); nothing should be.
		t.Fatalf("generated world has invalid resources: %v", inv[0].Err)
	}
	for i := 0; i < 40; i++ {
		req := genRequest(c)
		// Three times: the third answer comes from the snapshot's cache.
		var got engine.Decision
		var err error
		for try := 0; try < 3 && err == nil; try++ {
			got, err = snap.Decide(&req)
		}
		want, found := refDecide(resources, req)
		if !found {
			if err == nil {
				t.Fatalf("reference: mesh or type not found; engine answered %+v", got)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Decide(%+v): %v", req, err)
		}
		if !sameDecision(got, want) {
			t.Fatalf("Decide differs from the reference\nrequest: %+v\nengine:    %+v\nreference: %+v\nresources: %s",
				req, got, want, describe(resources))
		}
		checkProcedures(t, snap, req, want, resources)
		req.Explain = true
		if _, err := snap.Decide(&req); err != nil {
			t.Fatalf("Decide with explain: %v", err)
		}
	}
}

// checkProcedures holds each decision procedure (the posting lists, the
// bitmaps) to the reference's answer: a flow chooses one by the size of its
// lists, and the small worlds of these tests would leave the bitmaps unused.
func checkProcedures(t *testing.T, snap *engine.Snapshot, req engine.Request, want engine.Decision, resources []resource.Resource) {
	t.Helper()
	for i, forced := range engine.Procedures(req) {
		got, err := snap.Decide(&forced)
		if err != nil {
			t.Fatalf("Decide(%+v), procedure %d: %v", req, i, err)
		}
		if !sameDecision(got, want) {
			t.Fatalf("procedure %d (0 lists, 1 bitmaps) differs from the reference\nrequest: %+v\nengine:    %+v\nreference: %+v\nresources: %s",
				i, req, got, want, describe(resources))
		}
	}
}

func TestDecideMatchesReference(t *testing.T) {
	t.Parallel()
	n := 3000
	if testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		checkAgainstReference(t, seedBytes(i))
	}
}

func FuzzDecideMatchesReference(f *testing.F) {
	for i := 0; i < 20; i++ {
		f.Add([]byte(fmt.Sprintf("seed-%d", i)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstReference(t, data)
	})
}

// TestIncrementalMatchesBuild applies a world change by change (with deletes
// and rewrites) and checks that the result decides like a snapshot built from
// scratch and like the reference.
func TestIncrementalMatchesBuild(t *testing.T) {
	t.Parallel()
	n := 600
	if testing.Short() {
		n = 100
	}
	for i := 0; i < n; i++ {
		c := newChoices(seedBytes(1_000_000 + i))
		final := genWorld(c)
		other := genWorld(c) // a second world whose resources come and go
		snap := engine.Empty()
		rev := int64(0)
		var live []resource.Resource
		apply := func(changes ...engine.Change) {
			rev++
			snap = snap.Apply(rev, changes)
		}
		// Interleave: put other-world resources, then the final ones, deleting
		// other-world resources the final world lacks.
		for _, r := range other {
			apply(engine.Put(r))
		}
		batch := []engine.Change{}
		for _, r := range final {
			batch = append(batch, engine.Put(r))
			if c.chance(50) {
				apply(batch...)
				batch = nil
			}
		}
		apply(batch...)
		finalKeys := map[string]bool{}
		for _, r := range final {
			finalKeys[r.Key().String()] = true
		}
		for _, r := range other {
			if !finalKeys[r.Key().String()] {
				apply(engine.Delete(r.Key()))
			}
		}
		live = final
		built := engine.Build(rev, live)
		if got, want := snap.Len(), built.Len(); got != want {
			t.Fatalf("world %d: incremental snapshot has %d resources, built %d", i, got, want)
		}
		if got, want := snap.Digest(), built.Digest(); got != want {
			t.Fatalf("world %d: digests differ", i)
		}
		for j := 0; j < 30; j++ {
			req := genRequest(c)
			a, errA := snap.Decide(&req)
			b, errB := built.Decide(&req)
			if (errA == nil) != (errB == nil) || !sameDecision(a, b) {
				t.Fatalf("world %d: incremental %+v (%v) != built %+v (%v) for %+v", i, a, errA, b, errB, req)
			}
			if want, ok := refDecide(live, req); ok && !sameDecision(a, want) {
				t.Fatalf("world %d: incremental %+v != reference %+v for %+v%s", i, a, want, req, describe(live))
			} else if ok && errA == nil {
				checkProcedures(t, snap, req, want, live)
			}
		}
	}
}

// TestCachedDecisionsUnderConcurrency: many goroutines deciding the same flows
// on one snapshot (cache hits and stores racing) get the uncached answers.
func TestCachedDecisionsUnderConcurrency(t *testing.T) {
	t.Parallel()
	c := newChoices(seedBytes(4_000_000))
	resources := genWorld(c)
	snap := engine.Build(1, resources)
	reqs := make([]engine.Request, 64)
	want := make([]engine.Decision, len(reqs))
	for i := range reqs {
		reqs[i] = genRequest(c)
		reqs[i].NoCache = true
		want[i], _ = snap.Decide(&reqs[i])
		reqs[i].NoCache = false
	}
	done := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func(g int) {
			for n := 0; n < 2000; n++ {
				i := (n*7 + g) % len(reqs)
				got, _ := snap.Decide(&reqs[i])
				if !sameDecision(got, want[i]) {
					done <- fmt.Errorf("request %d: cached %+v, uncached %+v", i, got, want[i])
					return
				}
			}
			done <- nil
		}(g)
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestRulesForAgreesWithDecide: a firewall agent that walks a workload's
// RulesFor list in order and takes the first rule whose peer selector and ports
// match a flow reaches the side's answer of Decide (FirstMatch types).
func TestRulesForAgreesWithDecide(t *testing.T) {
	t.Parallel()
	n := 400
	if testing.Short() {
		n = 50
	}
	for i := 0; i < n; i++ {
		c := newChoices(seedBytes(5_000_000 + i))
		resources := genWorld(c)
		snap := engine.Build(1, resources)
		for j := 0; j < 20; j++ {
			req := genRequest(c)
			if len(resources) == 0 {
				break
			}
			if m, ok := resources[0].(*resource.Mesh); ok && req.Type == "TrafficPermission" && m.Types["TrafficPermission"].Combine == resource.DenyOverrides {
				continue
			}
			d, err := snap.Decide(&req)
			if err != nil {
				continue // mesh not found
			}
			for side, w := range []resource.Tags{req.Source, req.Destination} {
				rs, err := snap.RulesFor(req.Mesh, req.Type, w)
				if err != nil {
					t.Fatal(err)
				}
				list, peer, want := rs.Outbound, req.Destination, d.Outbound
				if side == 1 {
					list, peer, want = rs.Inbound, req.Source, d.Inbound
				}
				got := engine.SideDecision{Action: list.Fallback, Reason: list.FallbackReason}
				for _, r := range list.Rules {
					if !refPorts(r.Ports, req.Protocol, req.Port) {
						continue
					}
					hit := len(r.Peer) == 0
					for k := range r.Peer {
						if refSelects(&r.Peer[k], peer) {
							hit = true
						}
					}
					if hit {
						got = engine.SideDecision{Action: r.Action, Policy: r.Policy, Scope: r.Scope, Rule: r.Rule, Reason: engine.ReasonMatched}
						if r.Phase == "CatchAll" {
							got.Reason = engine.ReasonCatchAll
						}
						break
					}
				}
				want.Conf = nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("world %d, side %d: walking RulesFor gives %+v, Decide %+v\nrequest %+v%s", i, side, got, want, req, describe(resources))
				}
			}
		}
	}
}

// TestGeneratedSetsMatchReference: the benchmarks' sets — both policygen
// profiles, both combining algorithms, with and without scopes — decide like the
// reference. The dense profile gives the walk many matching rules per flow, two
// source selectors and DENY among them.
func TestGeneratedSetsMatchReference(t *testing.T) {
	t.Parallel()
	for _, pr := range profiles {
		for _, combine := range []resource.Combine{resource.FirstMatch, resource.DenyOverrides} {
			for _, scopes := range []int{0, 5} {
				set := policygen.Generate(policygen.Config{Seed: 9, Policies: 400, Scopes: scopes, Combine: combine, Profile: pr.profile})
				snap := engine.Build(1, set.Resources)
				flows := set.Flows(3, 60)
				for i := range flows {
					flows[i].NoCache = true
					got, err := snap.Decide(&flows[i])
					if err != nil {
						t.Fatal(err)
					}
					want, _ := refDecide(set.Resources, flows[i])
					if !sameDecision(got, want) {
						t.Fatalf("%s/%s/scopes=%d flow %d %+v:\nengine    %+v\nreference %+v", pr.name, combine, scopes, i, flows[i], got, want)
					}
					checkProcedures(t, snap, flows[i], want, nil)
				}
			}
		}
	}
}

// TestBitmapBlocksUnderUpdates: a dense set grown and shrunk policy batch by
// policy batch, so that the bitmaps' blocks (bitindex.go) split past their
// bound and lose rules, decides like a snapshot built at once and like the
// reference, by both procedures.
func TestBitmapBlocksUnderUpdates(t *testing.T) {
	t.Parallel()
	for _, combine := range []resource.Combine{resource.FirstMatch, resource.DenyOverrides} {
		const n = 6000
		set := policygen.Generate(policygen.Config{Seed: 4, Policies: n, Combine: combine, Profile: policygen.Dense})
		policies, rest := set.Resources[len(set.Resources)-n:], set.Resources[:len(set.Resources)-n]
		snap := engine.Build(1, append(append([]resource.Resource(nil), rest...), policies[:1000]...))
		rev := int64(1)
		// Grow to n in batches (blocks fill past blockMax and split), then
		// delete every third policy (blocks shrink).
		for i := 1000; i < len(policies); i += 1000 {
			rev++
			snap = snap.Apply(rev, puts(policies[i:min(i+1000, len(policies))]))
		}
		var live []resource.Resource
		var dels []engine.Change
		for i, p := range policies {
			if i%3 == 0 {
				dels = append(dels, engine.Delete(p.Key()))
			} else {
				live = append(live, p)
			}
		}
		if blocks := engine.BitBlocks(snap, set.Config.Mesh, set.Config.Type); blocks[0] < 2 {
			t.Fatalf("%s: the ALLOW rules fill %d block(s): no block split", combine, blocks[0])
		}
		rev++
		snap = snap.Apply(rev, dels)
		live = append(live, rest...)
		built := engine.Build(rev, live)
		flows := set.Flows(5, 60)
		for i := range flows {
			want, ok := refDecide(live, flows[i])
			if !ok {
				t.Fatalf("reference: no mesh or type for %+v", flows[i])
			}
			for _, s := range []*engine.Snapshot{snap, built} {
				f := flows[i]
				f.NoCache = true
				got, err := s.Decide(&f)
				if err != nil {
					t.Fatal(err)
				}
				if !sameDecision(got, want) {
					t.Fatalf("%s flow %d %+v:\nengine    %+v\nreference %+v", combine, i, flows[i], got, want)
				}
				checkProcedures(t, s, flows[i], want, nil)
			}
		}
	}
}

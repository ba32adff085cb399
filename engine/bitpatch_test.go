package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestBitmapPatchesMatchABuild: random sequences of puts (new policies,
// policies moved in the order, destinations of values no other rule names)
// and deletes, a few per change, patch the bitmaps' blocks (bitindex.go,
// patchBlock), never changing the snapshot they start from; every ten
// changes each held slot must carry exactly the bits
// its rule's terms ask (engine.CheckBitmaps, which fails on one wrong bit)
// and each posting list its rules and their ids (engine.CheckLists),
// and at the end the snapshot decides like one built at once and like the
// reference, by both procedures.
func TestBitmapPatchesMatchABuild(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		profile policygen.Profile
		combine resource.Combine
		n       int
		scopes  int
	}{
		{"sparse", policygen.Sparse, resource.FirstMatch, 8000, 5},
		{"dense", policygen.Dense, resource.FirstMatch, 5000, 0},
		{"dense", policygen.Dense, resource.DenyOverrides, 5000, 0},
	}
	for ci, c := range cases {
		t.Run(fmt.Sprintf("%s/%s", c.name, c.combine), func(t *testing.T) {
			t.Parallel()
			set := policygen.Generate(policygen.Config{Seed: uint64(10 + ci), Policies: c.n, Combine: c.combine, Profile: c.profile, Scopes: c.scopes})
			pols := set.Policies()
			rest := set.Resources[:len(set.Resources)-c.n]
			const reserve = 400
			live := map[string]*resource.Policy{}
			var names []string // live and reserve, stable order
			for i, p := range pols {
				names = append(names, p.Name)
				if i < len(pols)-reserve {
					live[p.Name] = p
				}
			}
			byName := map[string]*resource.Policy{}
			for _, p := range pols {
				byName[p.Name] = p
			}
			current := func() []resource.Resource {
				out := append([]resource.Resource(nil), rest...)
				for _, name := range names {
					if p, ok := live[name]; ok {
						out = append(out, p)
					}
				}
				return out
			}
			rev := int64(1)
			snap := engine.Build(rev, current())
			if err := engine.CheckBitmaps(snap); err != nil {
				t.Fatalf("built: %v", err)
			}
			rng := rand.New(rand.NewPCG(uint64(ci), 1))
			for step := 0; step < 200; step++ {
				var changes []engine.Change
				touched := map[string]bool{}
				for k := 1 + rng.IntN(3); k > 0; k-- {
					name := names[rng.IntN(len(names))]
					if touched[name] {
						continue
					}
					touched[name] = true
					p, ok := live[name]
					switch op := rng.IntN(4); {
					case !ok: // a reserve or deleted policy comes (back)
						live[name] = byName[name]
						changes = append(changes, engine.Put(byName[name]))
					case op == 0:
						delete(live, name)
						changes = append(changes, engine.Delete(p.Key()))
					case op == 1 && len(p.Destinations) > 0: // a value no other rule names
						alt := *p
						alt.Destinations = []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-new-%d", step)}}}
						live[name] = &alt
						changes = append(changes, engine.Put(&alt))
					default: // moved in the order
						alt := *p
						alt.Priority += int32(rng.IntN(7)) - 3
						live[name] = &alt
						changes = append(changes, engine.Put(&alt))
					}
				}
				rev++
				prev, digest := snap, engine.BitmapsDigest(snap)
				snap = snap.Apply(rev, changes)
				if engine.BitmapsDigest(prev) != digest {
					t.Fatalf("step %d: the update changed the blocks of the snapshot it started from", step)
				}
				if step%10 == 9 {
					if err := engine.CheckBitmaps(snap); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if err := engine.CheckLists(snap); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
			}
			if engine.FreeSlots(snap) == 0 {
				t.Fatal("no free slot left by a removal: the blocks were rebuilt, not patched")
			}
			resources := current()
			built := engine.Build(rev, resources)
			if err := engine.CheckBitmaps(built); err != nil {
				t.Fatalf("built: %v", err)
			}
			if err := engine.CheckLists(built); err != nil {
				t.Fatalf("built: %v", err)
			}
			flows := set.Flows(7, 60)
			for i := range flows {
				want, ok := refDecide(resources, flows[i])
				if !ok {
					t.Fatalf("reference: no mesh or type for %+v", flows[i])
				}
				for _, s := range []*engine.Snapshot{snap, built} {
					checkProcedures(t, s, flows[i], want, nil)
				}
			}
		})
	}
}

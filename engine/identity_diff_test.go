package engine_test

import (
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
)

// TestDecideSetsMatchesDecide: a flow between interned tag sets gets the
// answer of its tags, memoised or not, on random worlds.
func TestDecideSetsMatchesDecide(t *testing.T) {
	t.Parallel()
	for w := 0; w < 60; w++ {
		c := newChoices(seedBytes(5_000_000 + w))
		snap := engine.Build(1, genWorld(c))
		reg := inventory.NewRegistry(0, 0)
		for j := 0; j < 40; j++ {
			req := genRequest(c)
			src, errS := snap.Identify("m", req.Source, reg)
			dst, errD := snap.Identify("m", req.Destination, reg)
			if errS != nil || errD != nil {
				t.Fatal(errS, errD)
			}
			req.Source, req.Destination = src.Tags(), dst.Tags() // the own tags: what an identity stands for
			for round := 0; round < 3; round++ {
				want, errW := snap.Decide(&req)
				got, errG := snap.DecideSets(&engine.SetRequest{Mesh: req.Mesh, Type: req.Type, Source: src, Destination: dst,
					Protocol: req.Protocol, Port: req.Port, NoCache: round == 0})
				if (errW == nil) != (errG == nil) || !sameDecision(got, want) {
					t.Fatalf("world %d flow %d round %d: sets %+v (%v), tags %+v (%v)", w, j, round, got, errG, want, errW)
				}
			}
		}
	}
}

// TestMemoAcrossApplies: the memo carried from snapshot to snapshot answers
// as a fresh decision would, after every change of random worlds put and
// taken apart step by step.
func TestMemoAcrossApplies(t *testing.T) {
	t.Parallel()
	n := 60
	if testing.Short() {
		n = 15
	}
	for i := 0; i < n; i++ {
		c := newChoices(seedBytes(6_000_000 + i))
		world := append(genWorld(c), genWorld(c)...)
		reqs := make([]engine.Request, 12)
		for j := range reqs {
			reqs[j] = genRequest(c)
		}
		snap := engine.Empty()
		check := func(step int) {
			for j := range reqs {
				for round := 0; round < 2; round++ { // the second round is memoised
					got, errG := snap.Decide(&reqs[j])
					r := reqs[j]
					r.NoCache = true
					want, errW := snap.Decide(&r)
					if (errG == nil) != (errW == nil) || !sameDecision(got, want) || errG == nil && got.Revision != snap.Revision() {
						t.Fatalf("world %d step %d flow %d: memo %+v (%v), fresh %+v (%v)", i, step, j, got, errG, want, errW)
					}
				}
			}
		}
		rev := int64(0)
		for k, r := range world {
			rev++
			snap = snap.Apply(rev, []engine.Change{engine.Put(r)})
			check(k)
		}
		for k, r := range world {
			if c.chance(50) {
				rev++
				snap = snap.Apply(rev, []engine.Change{engine.Delete(r.Key())})
				check(len(world) + k)
			}
		}
	}
}

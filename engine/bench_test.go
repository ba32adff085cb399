package engine_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
)

// The engine's figures (README, "Engine performance"): make bench, or
//   go test -run '^$' -bench . -benchmem ./engine/

var benchSizes = []int{1_000, 10_000, 100_000}

func benchSet(n int, scopes int) *policygen.Set {
	return policygen.Generate(policygen.Config{Seed: 1, Policies: n, Scopes: scopes})
}

// BenchmarkDecide: the scan itself (NoCache), over 4096 generated flows; and
// the same flows with the snapshot's decision cache, where they repeat.
func BenchmarkDecide(b *testing.B) {
	for _, n := range benchSizes {
		for _, scopes := range []int{0, 50} {
			set := benchSet(n, scopes)
			snap := engine.Build(1, set.Resources)
			flows := set.Flows(2, 4096)
			cached := append([]engine.Request(nil), flows...)
			for i := range flows {
				flows[i].NoCache = true
			}
			b.Run(fmt.Sprintf("policies=%d/scopes=%d/cached", n, scopes), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if _, err := snap.Decide(&cached[i&4095]); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("policies=%d/scopes=%d", n, scopes), func(b *testing.B) {
				b.ReportAllocs()
				matched := 0
				for i := 0; b.Loop(); i++ {
					d, err := snap.Decide(&flows[i&4095])
					if err != nil {
						b.Fatal(err)
					}
					if d.Inbound.Reason == engine.ReasonMatched {
						matched++
					}
				}
				b.ReportMetric(float64(matched)/float64(b.N), "matched/op")
			})
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		set := benchSet(n, 50)
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				engine.Build(1, set.Resources)
			}
		})
	}
}

// BenchmarkApplyOne changes one policy of a 100k-policy snapshot, in the hard
// case: one mesh, one type. It alternates two versions of the policy so every
// iteration is a real update (remove the old rules, file the new ones).
func BenchmarkApplyOne(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		set := benchSet(n, 50)
		snap := engine.Build(1, set.Resources)
		base := set.Policies()[n/2]
		alt := *base
		alt.Priority = base.Priority + 1
		alt.Destinations = []engine.Selector{{Match: map[string]string{engine.ServiceTag: "svc-moved"}}}
		versions := []engine.Resource{&alt, base}
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			rev := int64(1)
			for i := 0; b.Loop(); i++ {
				rev++
				snap = snap.Apply(rev, []engine.Change{engine.Put(versions[i%2])})
			}
		})
	}
}

// BenchmarkMemory reports the heap a 100k-policy snapshot holds per policy,
// indexes included (the decoded resources are counted too: the snapshot keeps them).
func BenchmarkMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		set := benchSet(n, 50)
		snap := engine.Build(1, set.Resources)
		set = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/policy")
		runtime.KeepAlive(snap)
	}
}

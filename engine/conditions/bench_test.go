package conditions_test

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// BenchmarkConditionsAfterChange measures how long the conditions of a
// partition of generated policies take to be current after a one-policy
// change (a policy's destination and action rewritten), the previous
// snapshot's conditions judged (BENCHMARKS.md; the target is 50 ms at
// 10,000 policies). The first judgement — a whole lint — is reported apart
// as first-ms.
func BenchmarkConditionsAfterChange(b *testing.B) {
	for _, prof := range []struct {
		name string
		p    policygen.Profile
		n    []int
	}{{"sparse", policygen.Sparse, []int{10_000}}, {"dense", policygen.Dense, []int{2_000, 10_000}}} {
		for _, n := range prof.n {
			b.Run(fmt.Sprintf("%s/policies=%d", prof.name, n), func(b *testing.B) {
				set := policygen.Generate(policygen.Config{Seed: 11, Policies: n, Profile: prof.p})
				s := engine.Build(1, set.Resources)
				policies := set.Policies()
				tr := conditions.NewTracker()
				start := time.Now()
				if _, err := tr.Partition(s, "", ""); err != nil {
					b.Fatal(err)
				}
				first := time.Since(start)
				r := rand.New(rand.NewPCG(7, 7))
				var cpu time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					old := policies[r.IntN(len(policies))]
					p := *old
					p.Destinations = []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-%d", r.IntN(200))}}}
					p.Action = []resource.Action{resource.Allow, resource.Deny}[r.IntN(2)]
					p.Meta.ModRevision = s.Revision() + 1
					s = s.Apply(s.Revision()+1, []engine.Change{engine.Put(&p)})
					b.StartTimer()
					c := cpuTime()
					if _, err := tr.Partition(s, "", ""); err != nil {
						b.Fatal(err)
					}
					cpu += cpuTime() - c
				}
				b.ReportMetric(float64(first.Milliseconds()), "first-ms")
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// cpuTime is the process's CPU time so far, user and system: per op, it is
// steadier than wall time on a shared machine (cpu-ms/op).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkConditionsAfterWorkloadChange measures how long the conditions
// of 10,000 generated policies take to be current after one change of an
// inventory of 100,000 workloads: a workload deleted, or put back with the
// tags of another instance (NoWorkloads and the witnesses it moves, dead.go).
// The first judgement is reported apart as first-ms.
func BenchmarkConditionsAfterWorkloadChange(b *testing.B) {
	for _, prof := range []struct {
		name string
		p    policygen.Profile
	}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}} {
		b.Run(fmt.Sprintf("%s/policies=10000/workloads=100000", prof.name), func(b *testing.B) {
			set := policygen.Generate(policygen.Config{Seed: 11, Policies: 10_000, Profile: prof.p})
			workloads := set.Workloads(100_000)
			res := set.Resources
			for _, w := range workloads {
				res = append(res, w)
			}
			s := engine.Build(1, res)
			tr := conditions.NewTracker()
			start := time.Now()
			if _, err := tr.Partition(s, "", ""); err != nil {
				b.Fatal(err)
			}
			first := time.Since(start)
			r := rand.New(rand.NewPCG(7, 7))
			var gone *resource.Workload
			var cpu time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var ch engine.Change
				if gone == nil {
					gone = workloads[r.IntN(len(workloads))]
					ch = engine.Delete(gone.Key())
				} else {
					w := *gone
					w.Tags = workloads[r.IntN(len(workloads))].Tags
					w.Meta.ModRevision = s.Revision() + 1
					ch, gone = engine.Put(&w), nil
				}
				s = s.Apply(s.Revision()+1, []engine.Change{ch})
				b.StartTimer()
				c := cpuTime()
				if _, err := tr.Partition(s, "", ""); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime() - c
			}
			b.ReportMetric(float64(first.Milliseconds()), "first-ms")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

package analysis_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/policygen"
)

// BenchmarkLint lints a whole generated set of 2,000 to 10,000 policies
// (one mesh, one type): every rule settled shadowed or not, redundant or
// not, and the ties (BENCHMARKS.md; the target is 2 s at 10,000). cpu-s/op
// is the process's CPU time per lint, steadier than wall time on a shared
// machine.
func BenchmarkLint(b *testing.B) {
	for _, prof := range []struct {
		name string
		p    policygen.Profile
	}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}} {
		for _, n := range []int{2_000, 5_000, 10_000} {
			b.Run(fmt.Sprintf("%s/policies=%d", prof.name, n), func(b *testing.B) {
				set := policygen.Generate(policygen.Config{Seed: 11, Policies: n, Profile: prof.p})
				snap := engine.Build(1, set.Resources)
				b.ReportAllocs()
				b.ResetTimer()
				cpu := cpuTime()
				var ans *analysis.LintAnswer
				for i := 0; i < b.N; i++ {
					var err error
					if ans, err = analysis.Lint(snap, &analysis.LintRequest{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric((cpuTime()-cpu).Seconds()/float64(b.N), "cpu-s/op")
				b.ReportMetric(float64(len(ans.Findings)), "findings")
				b.ReportMetric(float64(len(ans.Unproven)), "unproven")
			})
		}
	}
}

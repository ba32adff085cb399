package analysis_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/policygen"
)

// BenchmarkLint lints a whole generated set of 10,000 policies (one mesh,
// one type): every rule settled shadowed or not, redundant or not, and the
// ties (BENCHMARKS.md; the target is 2 s).
func BenchmarkLint(b *testing.B) {
	for _, prof := range []struct {
		name string
		p    policygen.Profile
	}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}} {
		for _, n := range []int{2_000, 10_000} {
			b.Run(fmt.Sprintf("%s/policies=%d", prof.name, n), func(b *testing.B) {
				set := policygen.Generate(policygen.Config{Seed: 11, Policies: n, Profile: prof.p})
				snap := engine.Build(1, set.Resources)
				b.ReportAllocs()
				b.ResetTimer()
				var ans *analysis.LintAnswer
				for i := 0; i < b.N; i++ {
					var err error
					if ans, err = analysis.Lint(snap, &analysis.LintRequest{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(ans.Findings)), "findings")
				b.ReportMetric(float64(len(ans.Unproven)), "unproven")
			})
		}
	}
}

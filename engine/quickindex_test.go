package engine_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestQuickIndexAgrees: the benchmarks' baseline reaches verdict's decisions
// (action and deciding policy) on both profiles and both combining algorithms,
// so the comparison is between two implementations of the same thing.
func TestQuickIndexAgrees(t *testing.T) {
	t.Parallel()
	for _, pr := range profiles {
		for _, combine := range []resource.Combine{resource.FirstMatch, resource.DenyOverrides} {
			t.Run(fmt.Sprintf("%s/%s", pr.name, combine), func(t *testing.T) {
				set := policygen.Generate(policygen.Config{Seed: 1, Policies: 2000, Combine: combine, Profile: pr.profile})
				snap := engine.Build(1, set.Resources)
				q, err := policygen.NewQuickIndex(set)
				if err != nil {
					t.Fatal(err)
				}
				flows := set.Flows(2, 2000)
				matched := 0
				for i := range flows {
					d, err := snap.Decide(&flows[i])
					if err != nil {
						t.Fatal(err)
					}
					got := q.Decide(&flows[i])
					if got.Action != d.Action || got.Policy != d.Policy {
						t.Fatalf("flow %d %+v: quick index %+v, verdict %s by %q", i, flows[i], got, d.Action, d.Policy)
					}
					if d.Policy != "" {
						matched++
					}
				}
				if matched < len(flows)/5 {
					t.Fatalf("only %d of %d flows matched a policy: the agreement says little", matched, len(flows))
				}
			})
		}
	}
}

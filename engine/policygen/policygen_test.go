package policygen

import (
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
)

// TestDenseProfileShape: the dense profile is what its doc comment says — many
// policies match a flow, and their number grows with the set.
func TestDenseProfileShape(t *testing.T) {
	for _, tc := range []struct {
		policies int
		lo, hi   float64
	}{{10_000, 40, 100}} {
		set := Generate(Config{Seed: 1, Policies: tc.policies, Profile: Dense})
		q, err := NewQuickIndex(set)
		if err != nil {
			t.Fatal(err)
		}
		flows := set.Flows(2, 200)
		total, deny, two := 0, 0, 0
		for i := range flows {
			total += q.Matching(&flows[i])
		}
		for _, p := range set.Policies() {
			if p.Action == resource.Deny {
				deny++
			}
			if len(p.Sources) == 2 {
				two++
			}
		}
		avg := float64(total) / float64(len(flows))
		t.Logf("%d policies: %.1f match a flow on average; %d%% deny, %d%% two sources",
			tc.policies, avg, deny*100/tc.policies, two*100/tc.policies)
		if avg < tc.lo || avg > tc.hi {
			t.Errorf("%d policies: %.1f policies match a flow on average, want %v..%v", tc.policies, avg, tc.lo, tc.hi)
		}
	}
}

package engine_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestPerDestinationIndexMatchesScan: on generated sets of both profiles, with
// and without scopes, with audit policies, built at once and then changed
// (deletes, rewrites that flip a policy's mode), the destination index
// (destindex.go) chooses what a scan over every policy chooses, in the
// enforced and the shadow view.
func TestPerDestinationIndexMatchesScan(t *testing.T) {
	t.Parallel()
	n, flows := 3000, 3000
	if testing.Short() {
		n, flows = 800, 800
	}
	for _, pr := range []struct {
		name    string
		profile policygen.Profile
	}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}} {
		for _, scopes := range []int{0, 20} {
			t.Run(fmt.Sprintf("%s/scopes=%d", pr.name, scopes), func(t *testing.T) {
				set := policygen.Generate(policygen.Config{Seed: 3, Policies: n, Scopes: scopes, Profile: pr.profile,
					Select: resource.SelectPerDestination, AuditPercent: 10})
				snap := engine.Build(1, set.Resources)
				reqs := set.Flows(4, flows)
				chosen := check(t, snap, reqs)
				// Changes: every 7th policy deleted, every 11th rewritten in
				// the other mode.
				var changes []engine.Change
				for i, p := range set.Policies() {
					switch {
					case i%7 == 0:
						changes = append(changes, engine.Delete(p.Key()))
					case i%11 == 0:
						q := *p
						q.Mode = resource.ModeAudit
						if p.Mode == resource.ModeAudit {
							q.Mode = resource.ModeEnforce
						}
						changes = append(changes, engine.Put(&q))
					}
				}
				chosen += check(t, snap.Apply(2, changes), reqs)
				if chosen == 0 {
					t.Fatal("no flow's destination chose a policy: the check checked nothing")
				}
			})
		}
	}
}

// check compares the index's choices with the scan's for every request's
// destination; it returns how many choices named a policy.
func check(t *testing.T, snap *engine.Snapshot, reqs []engine.Request) int {
	t.Helper()
	chosen := 0
	for i := range reqs {
		got, want := engine.PerDestinationChoices(snap, &reqs[i])
		if got != want {
			t.Fatalf("destination %v: the index chose %q (enforced, shadow), a scan of every policy %q", reqs[i].Destination, got, want)
		}
		if want[0] != "" {
			chosen++
		}
	}
	return chosen
}

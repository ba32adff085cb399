package engine_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestCheckApplyAgreesWithApply: CheckApply builds the next snapshot without
// its rule indexes (a policy write paid the whole index update twice, once
// here and once in the syncer: 32% of verdictd's CPU under make loadtest's
// churn). Its verdict must be the one the full Apply gives: over random
// writes — policies moved into missing scopes and back, new, deleted, and
// whole scopes deleted — the errors equal those computed from the complete
// snapshot's Invalid.
func TestCheckApplyAgreesWithApply(t *testing.T) {
	t.Parallel()
	set := policygen.Generate(policygen.Config{Seed: 5, Policies: 1500, Scopes: 8})
	snap := engine.Build(1, set.Resources)
	pols := set.Policies()
	r := rand.New(rand.NewPCG(5, 5))
	var scopes []resource.Key
	for _, res := range set.Resources {
		if res.Key().Kind == resource.KindScope {
			scopes = append(scopes, res.Key())
		}
	}
	checked, refused := 0, 0
	for round := range 300 {
		var puts []resource.Resource
		var deletes []resource.Key
		used := map[string]bool{}
		for i := range 1 + r.IntN(3) {
			p := *pols[r.IntN(len(pols))]
			if used[p.Name] {
				continue // one call writes a key once
			}
			used[p.Name] = true
			switch r.IntN(6) {
			case 0:
				p.Scope = "nope" // a missing scope
			case 1:
				p.Scope = ""
			case 2:
				p.Name = fmt.Sprintf("new-%d-%d", round, i)
			case 3:
				deletes = append(deletes, p.Key())
				continue
			case 4:
				if round%10 == 0 && len(scopes) > 0 {
					deletes = append(deletes, scopes[r.IntN(len(scopes))])
					continue
				}
				p.Priority++
			default:
				p.Priority++
			}
			puts = append(puts, &p)
		}
		err := snap.CheckApply(puts, deletes)
		want := checkByApply(snap, puts, deletes)
		got := ""
		if err != nil {
			got = err.Error()
			refused++
		}
		if got != want {
			t.Fatalf("round %d: CheckApply says %q, the complete snapshot %q", round, got, want)
		}
		checked++
		if err == nil {
			var cs []engine.Change
			for _, p := range puts {
				cs = append(cs, engine.Put(p))
			}
			for _, k := range deletes {
				cs = append(cs, engine.Delete(k))
			}
			snap = snap.Apply(snap.Revision()+1, cs)
		}
	}
	if refused == 0 || refused == checked {
		t.Fatalf("%d of %d writes refused: the test exercises only one outcome", refused, checked)
	}
}

// checkByApply is CheckApply's error computed from the complete next
// snapshot (Apply), as CheckApply did before it skipped the indexes: one
// "field: reason" per new invalid resource, in path order, as
// resource.ValidationError renders them ("" when none).
func checkByApply(s *engine.Snapshot, puts []resource.Resource, deletes []resource.Key) string {
	before := map[string]bool{}
	for _, inv := range s.Invalid() {
		before[inv.Path] = true
	}
	idx := map[string]int{}
	var cs []engine.Change
	for i, p := range puts {
		idx[p.Key().String()] = i
		cs = append(cs, engine.Put(p))
	}
	for _, k := range deletes {
		idx[k.String()] = -1
		cs = append(cs, engine.Delete(k))
	}
	after := s.Apply(s.Revision()+1, cs).Invalid()
	slices.SortFunc(after, func(a, b engine.InvalidResource) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	var errs []resource.FieldError
	for _, inv := range after {
		i, written := idx[inv.Path]
		switch {
		case written && i >= 0:
			errs = append(errs, resource.FieldError{Field: fmt.Sprintf("resources[%d]", i), Reason: inv.Err.Error()})
		case !before[inv.Path]:
			errs = append(errs, resource.FieldError{Field: inv.Path, Reason: "this write would make it invalid: " + inv.Err.Error()})
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return (&resource.ValidationError{Errors: errs}).Error()
}

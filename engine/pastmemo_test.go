package engine

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// memoAnswer is the answer the memo holds for r's flow in s (nil: none).
func memoAnswer(s *Snapshot, r *Request) *Decision {
	ms, ok := s.meshes.Get(r.Mesh)
	if !ok {
		return nil
	}
	typ := r.Type
	if typ == "" {
		typ = resource.DefaultType
	}
	k := memoKey{Mesh: r.Mesh, Type: typ, Epoch: ms.epoch,
		Flow: index.Flow{Src: r.Source, Dst: r.Destination, Proto: r.Protocol, Port: r.Port}}
	if ts, ok := ms.types.Get(typ); ok {
		k.Epoch = ts.epoch
	}
	k.H = flowHashOf(r.Mesh, typ, inventory.TagsHash(r.Source), inventory.TagsHash(r.Destination), r.Protocol, r.Port)
	if e, ok := s.cache().Lookup(&k); ok {
		return e.Answer()
	}
	return nil
}

// TestPastMemoSharesWhatDidNotChange: snapshots read at past revisions share
// one memo keyed by epoch. Two revisions whose (mesh, type) partition did
// not change between them share the partition and so its entries (the later
// one misses nothing the earlier one holds); a change that may alter the
// partition's answers gives it entries of its own, which share the earlier
// revision's answer exactly where the two answers are equal. Each revision
// still answers as the decision procedure does, with its own revision.
func TestPastMemoSharesWhatDidNotChange(t *testing.T) {
	t.Parallel()
	for _, tc := range memoChanges(resource.Allow) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := memoWorld(t).WithMemo(PastMemo())
			after := before.Apply(2, []Change{tc.change})
			decideAll(t, before)
			decideAll(t, before) // seen twice: stored
			miss, _ := decideAll(t, after)
			switch {
			case tc.kept && miss != 0:
				t.Errorf("%d of %d flows missed at the later revision: its partition is the earlier one's", miss, len(memoFlows))
			case !tc.kept && miss != uint64(len(memoFlows)):
				t.Errorf("%d of %d flows missed at the later revision after %s: want all", miss, len(memoFlows), tc.name)
			}
			decideAll(t, after)    // stored at the later revision's epoch too
			for round := range 2 { // each revision's entries stay: asked in turn, none misses
				for _, s := range []*Snapshot{before, after} {
					if miss, _ := decideAll(t, s); miss != 0 {
						t.Errorf("round %d: revision %d: %d misses", round, s.Revision(), miss)
					}
				}
			}
			_, gotBefore := decideAll(t, before)
			_, gotAfter := decideAll(t, after)
			for i := range memoFlows {
				r := memoFlows[i]
				a, b := memoAnswer(before, &r), memoAnswer(after, &r)
				if a == nil || b == nil {
					t.Fatalf("flow %d: the memo holds %v at revision 1 and %v at 2: want both", i, a, b)
				}
				r.NoCache = true
				wantBefore, _ := before.Decide(&r)
				wantAfter, _ := after.Decide(&r)
				if !sameDecisionIgnoringRevision(gotBefore[i], wantBefore) || !sameDecisionIgnoringRevision(gotAfter[i], wantAfter) {
					t.Errorf("flow %d: memo %+v then %+v, decided %+v then %+v", i, gotBefore[i], gotAfter[i], wantBefore, wantAfter)
				}
				if equal := sameDecisionIgnoringRevision(wantBefore, wantAfter); equal != (a == b) {
					t.Errorf("flow %d: answers equal %v, one answer shared %v", i, equal, a == b)
				}
			}
		})
	}
}

// TestKeptPartitionAnswersOnlyItsOwn: a snapshot keeps the first partition it
// decides to find it again without walking its maps; whichever partition
// comes first, every other (mesh, type) is still answered as a fresh snapshot
// answers it, errors included.
func TestKeptPartitionAnswersOnlyItsOwn(t *testing.T) {
	t.Parallel()
	web, db := resource.Tags{"app": "web"}, resource.Tags{"app": "db"}
	asks := []Request{
		{Mesh: "m", Source: web, Destination: db},
		{Mesh: "m", Type: "TrafficLog", Source: web, Destination: db},
		{Mesh: "m", Type: "NoSuchType", Source: web, Destination: db},
		{Mesh: "other", Source: web, Destination: db},
		{Mesh: "none", Source: web, Destination: db},
		{Source: web, Destination: db},
	}
	answer := func(s *Snapshot, r Request) string {
		d, err := s.Decide(&r)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("%v %s %v %v", d.Action, d.Policy, d.Outbound, d.Inbound)
	}
	for first := range asks {
		t.Run(fmt.Sprint(asks[first].Mesh, "/", asks[first].Type), func(t *testing.T) {
			t.Parallel()
			s := memoWorld(t)
			answer(s, asks[first])
			for round := range 3 { // the memo stores from the second sight on
				for i, r := range asks {
					if got, want := answer(s, r), answer(memoWorld(t), r); got != want {
						t.Errorf("round %d, after %d first: flow %d answers %s, a fresh snapshot %s", round, first, i, got, want)
					}
				}
			}
		})
	}
}

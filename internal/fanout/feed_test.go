package fanout

import (
	"errors"
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The feed's state is the syncer's snapshot: a stream from revision 0 gets
// every stored key of it (resources, valid or not, and broken values) in key
// order; a later reset (the feed resubscribed after falling behind) pushes
// exactly the difference — changed and new keys, deletes — as one change set.
func TestFeedStateIsTheSnapshot(t *testing.T) {
	t.Parallel()
	put := func(name string, rev int64, app string) engine.Change {
		w := &resource.Workload{Mesh: "default", Name: name, Tags: map[string]string{"app": app},
			Addresses: []string{fmt.Sprintf("10.0.0.%d", len(name))}, Meta: resource.Meta{CreateRevision: rev, ModRevision: rev}}
		return engine.Put(w)
	}
	brokenPath := "default/policies/TrafficPermission/broken"
	broken := engine.Change{Path: brokenPath, Key: resource.Key{Kind: resource.KindPolicy, Mesh: "default", Type: "TrafficPermission", Name: "broken"},
		Err: fmt.Errorf("%w: does not decode", resource.ErrInvalid), ModRevision: 4, Value: []byte("{")}
	keys := func(rcs []*verdictv1.ResourceChange) string {
		out := ""
		for _, rc := range rcs {
			switch {
			case rc.GetDeleted():
				out += " -" + rc.GetKey()
			case rc.GetResource().GetError() != "":
				out += " !" + rc.GetKey()
			default:
				out += fmt.Sprintf(" %s@%d", rc.GetKey(), rc.GetResource().GetModRevision())
			}
		}
		return out
	}

	s1 := engine.Empty().Apply(4, []engine.Change{put("a", 2, "web"), put("bb", 3, "db"), broken})
	f := NewFeed(FeedConfig{})
	f.reset(s1)
	snap, rev, _ := f.start(0)
	if want := " !default/policies/TrafficPermission/broken default/workloads/a@2 default/workloads/bb@3"; keys(snap) != want || rev != 4 {
		t.Fatalf("first state at %d:%s\nwant at 4:%s", rev, keys(snap), want)
	}
	if !errors.Is(broken.Err, resource.ErrInvalid) || snap[0].GetResource().GetError() == "" {
		t.Fatalf("the broken value shows as %v", snap[0])
	}

	cs := []engine.Change{put("bb", 5, "api")}
	s2 := s1.Apply(5, cs)
	f.apply(s2, cs)
	if set, _, _ := f.next(0); set == nil || keys(set.changes) != " default/workloads/bb@5" {
		t.Fatalf("the update's change set: %+v", set)
	}

	// Resubscribed at 8: a deleted, bb unchanged, ccc new, broken repaired.
	s3 := s2.Apply(8, []engine.Change{engine.Delete(resource.Key{Kind: resource.KindWorkload, Mesh: "default", Name: "a"}),
		put("ccc", 7, "db"), engine.Delete(broken.Key)})
	f.reset(s3)
	set, _, _ := f.next(1)
	if want := " -default/policies/TrafficPermission/broken -default/workloads/a default/workloads/ccc@7"; set == nil || set.rev != 8 || keys(set.changes) != want {
		t.Fatalf("the reset's change set: %+v\nwant at 8:%s", set, want)
	}
	snap, rev, seq := f.start(0)
	if want := " default/workloads/bb@5 default/workloads/ccc@7"; keys(snap) != want || rev != 8 || seq != 2 {
		t.Fatalf("state at %d (seq %d):%s\nwant at 8 (seq 2):%s", rev, seq, keys(snap), want)
	}
}

package fanout

import (
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store/syncer"
)

// Updates taken together are one update: the newer snapshot, the older
// one's predecessor, and each key's last change only, in the order of the
// last changes.
func TestCoalescedUpdates(t *testing.T) {
	t.Parallel()
	w := func(name, app string) engine.Change {
		return engine.Put(&resource.Workload{Mesh: "default", Name: name, Tags: map[string]string{"app": app}})
	}
	del := func(name string) engine.Change {
		return engine.Delete(resource.Key{Kind: resource.KindWorkload, Mesh: "default", Name: name})
	}
	s1, s2, s3 := engine.Build(1, nil), engine.Build(2, nil), engine.Build(3, nil)
	cases := []struct {
		name string
		a, b []engine.Change
		want string // each change as name=app, or name- for a delete
	}{
		{"disjoint keys keep their order", []engine.Change{w("a", "1")}, []engine.Change{w("b", "1")}, "a=1 b=1"},
		{"a later put wins", []engine.Change{w("a", "1"), w("b", "1")}, []engine.Change{w("a", "2")}, "b=1 a=2"},
		{"a delete after a put", []engine.Change{w("a", "1")}, []engine.Change{del("a")}, "a-"},
		{"a put after a delete", []engine.Change{del("a")}, []engine.Change{w("a", "3")}, "a=3"},
		{"twice in one update", []engine.Change{w("a", "1"), w("a", "2")}, nil, "a=2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := coalesced(syncer.Update{Snapshot: s2, Previous: s1, Changes: tc.a}, syncer.Update{Snapshot: s3, Previous: s2, Changes: tc.b})
			if u.Snapshot != s3 || u.Previous != s1 {
				t.Fatalf("snapshots %d after %d, want 3 after 1", u.Snapshot.Revision(), u.Previous.Revision())
			}
			var got []string
			for _, c := range u.Changes {
				if wl, ok := c.Resource.(*resource.Workload); ok {
					got = append(got, wl.Name+"="+wl.Tags["app"])
				} else {
					got = append(got, c.Key.Name+"-")
				}
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("changes %v, want %s", got, tc.want)
			}
		})
	}
}

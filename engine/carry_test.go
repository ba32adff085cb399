package engine_test

import (
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestCarried holds which value a snapshot's Carried build starts from: the
// newest its lineage built — along Apply, never from a preview, never across
// Build or WithMemo.
func TestCarried(t *testing.T) {
	t.Parallel()
	type key struct{}
	pol := &resource.Policy{Mesh: "m", Type: "TrafficPermission", Name: "p", Action: resource.Allow,
		Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}}
	// carry records what a snapshot's build was handed and builds its
	// label.
	carry := func(s *engine.Snapshot, label string) (handed any) {
		s.Carried(key{}, func(prev any) any {
			handed = prev
			return label
		})
		return handed
	}
	root := engine.Build(1, []resource.Resource{pol})
	tests := []struct {
		name string
		snap func() *engine.Snapshot
		want any
	}{
		{"a snapshot of a new lineage starts from nothing", func() *engine.Snapshot { return engine.Build(1, nil) }, nil},
		{"a derived snapshot starts from the lineage's newest", func() *engine.Snapshot { return root.Apply(2, nil) }, "root"},
		{"a preview starts from its parent's lineage", func() *engine.Snapshot {
			p, _, err := root.Preview(nil, []resource.Key{pol.Key()})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}, "a derived snapshot starts from the lineage's newest"},
		{"WithMemo starts a lineage", func() *engine.Snapshot { return root.WithMemo(engine.PastMemo()).Apply(3, nil) }, nil},
	}
	if got := carry(root, "root"); got != nil {
		t.Fatalf("the root was handed %v", got)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := carry(tc.snap(), tc.name); got != tc.want {
				t.Errorf("handed %v, want %v", got, tc.want)
			}
		})
	}
	// The preview above wrote nothing to the lineage: it still hands the
	// newest applied snapshot's value; a value is built once per snapshot.
	next := root.Apply(4, nil)
	if got, want := carry(next, "next"), tests[1].name; got != want {
		t.Errorf("after a preview, handed %v, want %v", got, want)
	}
	if got := carry(next, "again"); got != nil {
		t.Errorf("a second Carried built again (handed %v)", got)
	}
}

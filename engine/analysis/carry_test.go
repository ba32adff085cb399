package analysis_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestReachCarriesClasses holds the classes a snapshot carries from the one
// it was derived from: kept when nothing they were made by changed, made
// anew otherwise, and the answer always the one a snapshot built from
// scratch gives (the outside classes included, whose conditions a deleted
// policy takes away).
func TestReachCarriesClasses(t *testing.T) {
	t.Parallel()
	policy := func(name string, action resource.Action, src map[string]string) *resource.Policy {
		return &resource.Policy{Mesh: "m", Type: "TrafficPermission", Name: name, Action: action,
			Sources:      []resource.Selector{{Match: src}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "db"}}}}
	}
	base := []resource.Resource{
		policy("web-db", resource.Allow, map[string]string{resource.ServiceTag: "web"}),
		policy("api-db", resource.Deny, map[string]string{resource.ServiceTag: "api"}),
		policy("spiffe-db", resource.Deny, map[string]string{resource.PrincipalTag: "spiffe://m/batch"}),
		policy("all-db", resource.Allow, map[string]string{}),
	}
	for i, svc := range []string{"web", "api", "db", "web", "api", "batch"} {
		base = append(base, &resource.Workload{Mesh: "m", Name: fmt.Sprintf("w-%d", i),
			Tags: resource.Tags{resource.ServiceTag: svc, "pod": fmt.Sprintf("p%d", i)}, Addresses: []string{fmt.Sprintf("10.0.0.%d", i+1)}})
	}
	tests := []struct {
		name    string
		changes []engine.Change
		carried bool
	}{
		{"nothing changed", nil, true},
		{"a policy flips its action", []engine.Change{engine.Put(policy("api-db", resource.Allow, map[string]string{resource.ServiceTag: "api"}))}, true},
		{"a policy is deleted", []engine.Change{engine.Delete(base[2].Key())}, true},
		{"a policy names a new value", []engine.Change{engine.Put(policy("new-db", resource.Allow, map[string]string{resource.ServiceTag: "cron"}))}, false},
		{"a policy tests a new key", []engine.Change{engine.Put(policy("new-db", resource.Allow, map[string]string{"team": "x"}))}, false},
		{"a workload is added", []engine.Change{engine.Put(&resource.Workload{Mesh: "m", Name: "w-9",
			Tags: resource.Tags{resource.ServiceTag: "web"}})}, false},
	}
	req := analysis.ReachRequest{Mesh: "m", Endpoint: inventory.Endpoint{Workload: "w-2"}, Destination: true, Protocol: resource.TCP, Port: 5432}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prev := engine.Build(1, base)
			if _, err := analysis.Reach(prev, &req); err != nil {
				t.Fatal(err)
			}
			next := prev.Apply(2, tc.changes)
			got, err := analysis.Reach(next, &req)
			if err != nil {
				t.Fatal(err)
			}
			if c := analysis.SharesClasses(prev, next, "m", ""); c != tc.carried {
				t.Errorf("classes carried = %v, want %v", c, tc.carried)
			}
			var all []resource.Resource
			next.Resources(func(e engine.Entry) bool {
				all = append(all, e.Resource)
				return true
			})
			want, err := analysis.Reach(engine.Build(2, all), &req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Entries, want.Entries) || !reflect.DeepEqual(got.Notes, want.Notes) {
				t.Errorf("derived snapshot answers\n%+v\nbuilt from scratch\n%+v", got.Entries, want.Entries)
			}
		})
	}
}

// TestWarmPreparesWhatReachStartsFrom: Warm builds a fresh snapshot's base
// once per partition, the snapshots derived from it carry that base (a Reach
// there shares its classes), and a second Warm of the lineage prepares
// nothing.
func TestWarmPreparesWhatReachStartsFrom(t *testing.T) {
	t.Parallel()
	res := []resource.Resource{
		&resource.Policy{Mesh: "m", Type: "TrafficPermission", Name: "web-db", Action: resource.Allow,
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: "web"}}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "db"}}}},
		&resource.Workload{Mesh: "m", Name: "db-1", Tags: resource.Tags{resource.ServiceTag: "db"}},
		&resource.Workload{Mesh: "m", Name: "web-1", Tags: resource.Tags{resource.ServiceTag: "web"}},
	}
	s := engine.Build(1, res)
	if n := analysis.Warm(context.Background(), s); n == 0 {
		t.Fatal("Warm prepared no partition of a fresh snapshot")
	}
	next := s.Apply(2, []engine.Change{engine.Put(&resource.Policy{Mesh: "m", Type: "TrafficPermission", Name: "web-db",
		Action: resource.Deny, Sources: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "web"}}},
		Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "db"}}}})})
	if n := analysis.Warm(context.Background(), next); n != 0 {
		t.Fatalf("Warm prepared %d partitions of a lineage it had warmed", n)
	}
	if !analysis.SharesClasses(s, next, "m", "TrafficPermission") {
		t.Error("a snapshot derived from a warmed one does not carry its classes")
	}
	if n := analysis.Warm(context.Background(), engine.Build(2, res)); n == 0 {
		t.Error("Warm prepared nothing for a snapshot built anew (a lineage of its own)")
	}
}

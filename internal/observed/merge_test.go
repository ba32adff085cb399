package observed

import (
	"testing"

	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestMerge: a flow several sources saw is one flow with their counts
// summed — the default mesh and type named or not, tags in any order — and
// flows that differ in an end's form, the port or the protocol stay apart.
func TestMerge(t *testing.T) {
	flow := func(mesh string, src inventory.Endpoint, port uint32, n uint64) analysis.ObservedFlow {
		return analysis.ObservedFlow{Mesh: mesh, Source: src, Destination: inventory.Endpoint{Workload: "db-1"},
			Protocol: resource.TCP, Port: port, Count: n}
	}
	web := inventory.Endpoint{Tags: resource.Tags{"app": "web", "env": "prod"}}
	web2 := inventory.Endpoint{Tags: resource.Tags{"env": "prod", "app": "web"}}
	addr := inventory.Endpoint{Address: "10.0.0.7"}
	got := Merge([][]analysis.ObservedFlow{
		{flow("", web, 5432, 2), flow("", addr, 5432, 1)},
		nil,
		{flow(resource.DefaultMesh, web2, 5432, 3), flow("", web, 80, 4)},
	})
	want := []uint64{5, 1, 4}
	if len(got) != len(want) {
		t.Fatalf("%d flows, want %d: %+v", len(got), len(want), got)
	}
	for i, f := range got {
		if f.Count != want[i] {
			t.Errorf("flow %d (%+v): count %d, want %d", i, f, f.Count, want[i])
		}
	}
	if one := [][]analysis.ObservedFlow{nil, {flow("", web, 1, 1)}}; len(Merge(one)) != 1 {
		t.Errorf("one source: %v", Merge(one))
	}
}

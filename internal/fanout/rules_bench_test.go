package fanout

import (
	"context"
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// BenchmarkRulesHubPolicyWrite: the hub's work for one write of a policy
// that selects one workload, with 2,000 groups of distinct workloads on 201
// policies that match every workload (the hostile harness's mesh). Before
// RulesImpact every write computed all 2,000 groups again.
func BenchmarkRulesHubPolicyWrite(b *testing.B) {
	var rs []resource.Resource
	for i := range 201 {
		rs = append(rs, &resource.Policy{Mesh: resource.DefaultMesh, Type: resource.DefaultType, Name: fmt.Sprintf("p-%03d", i), Action: resource.Allow,
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: "*"}}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "*"}}}})
	}
	snap := engine.Build(1, rs)
	sy := &laggingSyncer{snap: snap}
	h := NewHub(HubConfig{Source: sy})
	for i := range 2000 {
		if _, err := h.watch(context.Background(), "", "", Workload{Tags: resource.Tags{resource.ServiceTag: fmt.Sprintf("svc-%d", i)}}, false, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := &resource.Policy{Mesh: resource.DefaultMesh, Type: resource.DefaultType, Name: "one", Action: []resource.Action{resource.Allow, resource.Deny}[i%2],
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: "peer"}}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "svc-7"}}}}
		ch := []engine.Change{engine.Put(p)}
		next := snap.Apply(snap.Revision()+1, ch)
		h.refresh(next, snap, ch)
		snap = next
	}
}

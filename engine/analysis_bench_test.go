package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// analysisBench is a generated policy set with an inventory: n workloads
// whose tags are instances of the set's services (policygen's flows).
type analysisBench struct {
	set       *policygen.Set
	snap      *engine.Snapshot
	workloads []*resource.Workload
	flows     []engine.Request // policygen's flows, for their protocols and ports
}

func newAnalysisBench(policies, workloads int) *analysisBench {
	set := policygen.Generate(policygen.Config{Seed: 11, Policies: policies})
	ab := &analysisBench{set: set, flows: set.Flows(12, max(workloads, 1000))}
	resources := append([]resource.Resource{}, set.Resources...)
	for i := 0; i < workloads; i++ {
		w := &resource.Workload{Mesh: set.Config.Mesh, Name: fmt.Sprintf("w-%d", i), Tags: ab.flows[i].Source,
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}}
		ab.workloads = append(ab.workloads, w)
		resources = append(resources, w)
	}
	ab.snap = engine.Build(1, resources)
	return ab
}

// bulkFlows returns n flows between the inventory's workloads (as observed
// traffic is): pairs drawn at random, protocols and ports from policygen.
func (ab *analysisBench) bulkFlows(n int) [][3]int {
	r := rand.New(rand.NewPCG(13, 14))
	out := make([][3]int, n)
	for i := range out {
		out[i] = [3]int{r.IntN(len(ab.workloads)), r.IntN(len(ab.workloads)), r.IntN(len(ab.flows))}
	}
	return out
}

// BenchmarkBulkDecide decides 1M flows between 10k workloads of a 10k-policy
// set: per flow, uncached (what N calls of Decide cost without the memo), and
// in bulk (the analyses' way). Compare their ns/flow.
func BenchmarkBulkDecide(b *testing.B) {
	ab := newAnalysisBench(10_000, 10_000)
	flows := ab.bulkFlows(1_000_000)
	b.Run("per-flow-uncached", func(b *testing.B) {
		b.ReportAllocs()
		for n := 0; n < b.N; n++ {
			for _, f := range flows {
				p := &ab.flows[f[2]]
				req := engine.Request{Mesh: ab.set.Config.Mesh, Type: ab.set.Config.Type, Source: ab.workloads[f[0]].Tags,
					Destination: ab.workloads[f[1]].Tags, Protocol: p.Protocol, Port: p.Port, NoCache: true}
				if _, err := ab.snap.Decide(&req); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(flows)), "ns/flow")
	})
	b.Run("bulk", func(b *testing.B) {
		b.ReportAllocs()
		decisions := 0
		for n := 0; n < b.N; n++ {
			bk, err := ab.snap.Bulk(ab.set.Config.Mesh, ab.set.Config.Type)
			if err != nil {
				b.Fatal(err)
			}
			class := make([]engine.ClassID, len(ab.workloads))
			for i, w := range ab.workloads {
				class[i] = bk.Intern(w.Tags)
			}
			for _, f := range flows {
				p := &ab.flows[f[2]]
				bk.Decide(class[f[0]], class[f[1]], p.Protocol, p.Port)
			}
			decisions = bk.Decisions()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(flows)), "ns/flow")
		b.ReportMetric(float64(decisions), "decisions")
	})
}

// BenchmarkReach answers who can reach one workload on one port at 100k
// workloads and 10k policies.
func BenchmarkReach(b *testing.B) {
	ab := newAnalysisBench(10_000, 100_000)
	req := engine.ReachRequest{Mesh: ab.set.Config.Mesh, Endpoint: inventory.Endpoint{Workload: "w-7"}, Destination: true,
		Protocol: resource.TCP, Port: 8080}
	b.ReportAllocs()
	b.ResetTimer()
	var entries int
	for n := 0; n < b.N; n++ {
		ans, err := ab.snap.Reach(&req)
		if err != nil {
			b.Fatal(err)
		}
		entries = len(ans.Entries)
	}
	b.ReportMetric(float64(entries), "entries")
}

// BenchmarkMatrix answers the allowed pairs among 1k × 1k workloads of a
// 10k-policy set on every class of flows.
func BenchmarkMatrix(b *testing.B) {
	ab := newAnalysisBench(10_000, 1_000)
	b.ReportAllocs()
	b.ResetTimer()
	var entries, decisions int
	for n := 0; n < b.N; n++ {
		entries = 0
		_, d, err := ab.snap.Matrix(&engine.MatrixRequest{Mesh: ab.set.Config.Mesh}, func(engine.MatrixEntry) bool {
			entries++
			return true
		})
		if err != nil {
			b.Fatal(err)
		}
		decisions = d
	}
	b.ReportMetric(float64(entries), "entries")
	b.ReportMetric(float64(decisions), "decisions")
}

// BenchmarkImpact judges a one-policy change (a DENY between two services)
// over 1M observed flows between 10k workloads of a 10k-policy set (the
// inventory's own pairs left out: no workload in the mesh of the flows'
// judgement but those the flows name).
func BenchmarkImpact(b *testing.B) {
	ab := newAnalysisBench(10_000, 10_000)
	flows := ab.bulkFlows(1_000_000)
	observed := make([]engine.ObservedFlow, len(flows))
	for i, f := range flows {
		p := &ab.flows[f[2]]
		observed[i] = engine.ObservedFlow{Mesh: ab.set.Config.Mesh, Type: ab.set.Config.Type,
			Source: inventory.Endpoint{Workload: ab.workloads[f[0]].Name}, Destination: inventory.Endpoint{Workload: ab.workloads[f[1]].Name},
			Protocol: p.Protocol, Port: p.Port, Count: 1}
	}
	src, dst := ab.workloads[0].Tags[resource.ServiceTag], ab.workloads[1].Tags[resource.ServiceTag]
	deny := &resource.Policy{Mesh: ab.set.Config.Mesh, Type: ab.set.Config.Type, Name: "deny-one", Action: resource.Deny,
		Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: src}}},
		Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: dst}}}}
	b.ReportAllocs()
	b.ResetTimer()
	var ans *engine.ImpactAnswer
	for n := 0; n < b.N; n++ {
		var err error
		ans, err = ab.snap.Impact(&engine.ImpactRequest{Puts: []resource.Resource{deny}, Flows: observed})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ans.Changes)), "changes")
	b.ReportMetric(float64(ans.Redecided), "redecided")
}

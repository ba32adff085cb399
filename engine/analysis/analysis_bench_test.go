package analysis_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// analysisBench is a generated policy set with an inventory: n workloads
// whose tags are instances of the set's services (policygen's flows).
type analysisBench struct {
	set       *policygen.Set
	snap      *engine.Snapshot
	resources []resource.Resource
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
	ab.resources = resources
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

// cpuTime is the process's user and system time: on a shared machine the
// benchmarks report CPU per flow beside wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBulkDecide decides 1M flows against a 10k-policy set, per flow
// uncached (N calls of Decide without the memo) and in bulk (the analyses'
// way), on two kinds of traffic:
//   - replicas: 1M distinct flows between 100k instances of 1k deployments
//     (instances differ by their kuma.io/name), each deployment calling 8
//     others on one port — what an observed-flows table holds;
//   - distinct: 1M random pairs of 10k workloads with distinct tag sets,
//     where no two flows share a class pair (the bulk's worst case).
//
// ns/flow is wall time; cpu-ns/flow the process's CPU time, steadier on a
// shared machine.
func BenchmarkBulkDecide(b *testing.B) {
	set := policygen.Generate(policygen.Config{Seed: 11, Policies: 10_000})
	gen := set.Flows(12, 20_000)
	type flow struct {
		src, dst resource.Tags
		proto    resource.Protocol
		port     uint32
	}
	var replicas, distinct []flow
	{
		r := rand.New(rand.NewPCG(21, 22))
		const deployments, instances, callees = 1000, 100, 8
		inst := make([][]resource.Tags, deployments)
		for d := range inst {
			for i := 0; i < instances; i++ {
				t := maps.Clone(gen[d].Source)
				t[resource.NameTag] = fmt.Sprintf("d%d-%d", d, i)
				inst[d] = append(inst[d], t)
			}
		}
		calls := make([][callees]int, deployments)
		for d := range calls {
			for k := range calls[d] {
				calls[d][k] = r.IntN(deployments)
			}
		}
		for len(replicas) < 1_000_000 {
			sd, k := r.IntN(deployments), r.IntN(callees)
			dd := calls[sd][k]
			port := []uint32{80, 443, 8080, 5432, 9050}[(sd+k)%5]
			replicas = append(replicas, flow{inst[sd][r.IntN(instances)], inst[dd][r.IntN(instances)], resource.TCP, port})
		}
	}
	{
		r := rand.New(rand.NewPCG(13, 14))
		for len(distinct) < 1_000_000 {
			f := &gen[r.IntN(10_000)]
			distinct = append(distinct, flow{gen[r.IntN(10_000)].Source, gen[10_000+r.IntN(10_000)].Source, f.Protocol, f.Port})
		}
	}
	snap := engine.Build(1, set.Resources)
	mesh, typ := set.Config.Mesh, set.Config.Type
	for _, traffic := range []struct {
		name  string
		flows []flow
	}{{"replicas", replicas}, {"distinct", distinct}} {
		flows := traffic.flows
		b.Run(traffic.name+"/per-flow-uncached", func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuTime()
			for n := 0; n < b.N; n++ {
				for i := range flows {
					f := &flows[i]
					req := engine.Request{Mesh: mesh, Type: typ, Source: f.src, Destination: f.dst, Protocol: f.proto, Port: f.port, NoCache: true}
					if _, err := snap.Decide(&req); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(flows)), "ns/flow")
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N*len(flows)), "cpu-ns/flow")
		})
		b.Run(traffic.name+"/bulk", func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuTime()
			decisions := 0
			for n := 0; n < b.N; n++ {
				bk, err := analysis.NewBulk(snap, mesh, typ)
				if err != nil {
					b.Fatal(err)
				}
				// Each distinct end is interned once (an inventory's workloads,
				// an observed-flows table's endpoints).
				class := map[*byte]analysis.ClassID{}
				classOf := func(t resource.Tags) analysis.ClassID {
					k := mapID(t)
					c, ok := class[k]
					if !ok {
						c = bk.Intern(t)
						class[k] = c
					}
					return c
				}
				for i := range flows {
					f := &flows[i]
					bk.Decide(classOf(f.src), classOf(f.dst), f.proto, f.port)
				}
				decisions = bk.Decisions()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(flows)), "ns/flow")
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N*len(flows)), "cpu-ns/flow")
			b.ReportMetric(float64(decisions), "decisions")
		})
	}
}

// mapID identifies a tag map by its storage (the benchmark's ends are shared
// maps, as a table's endpoints are).
func mapID(t resource.Tags) *byte { return *(**byte)(unsafe.Pointer(&t)) }

// BenchmarkReach answers who can reach one workload on one port at 100k
// workloads and 10k policies, on a snapshot that has not answered one
// before:
//   - cold: the first Reach of a lineage (it interns every workload:
//     bulkbase.go);
//   - first: a snapshot derived from one that answered a Reach, nothing
//     changed;
//   - after-policy-change: a snapshot one policy apart from one that
//     answered a Reach (the policy flips its action: it tests no new
//     condition, so the classes are carried);
//   - after-new-condition: likewise, by a policy that names a value no
//     selector named (the classes are interned anew);
//
// and again on the same snapshot.
func BenchmarkReach(b *testing.B) {
	ab := newAnalysisBench(10_000, 100_000)
	req := analysis.ReachRequest{Mesh: ab.set.Config.Mesh, Endpoint: inventory.Endpoint{Workload: "w-7"}, Destination: true,
		Protocol: resource.TCP, Port: 8080}
	var flip *resource.Policy
	for _, r := range ab.set.Resources {
		if p, ok := r.(*resource.Policy); ok && len(p.Sources) > 0 {
			flip = p
			break
		}
	}
	fresh := 0 // -count runs each mode again on the same lineage
	change := func(snap *engine.Snapshot, newCondition bool) *engine.Snapshot {
		p := *flip
		p.Action = resource.Deny
		if snap.Revision()%2 == 0 {
			p.Action = resource.Allow
		}
		if newCondition {
			fresh++
			p.Sources = []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("new-%d", fresh)}}}
		}
		m := p.Metadata()
		m.ModRevision = snap.Revision() + 1
		return snap.Apply(snap.Revision()+1, []engine.Change{engine.Put(p.WithMeta(m))})
	}
	for _, mode := range []string{"cold", "first", "after-policy-change", "after-new-condition", "again"} {
		b.Run(mode, func(b *testing.B) {
			snap := ab.snap
			next := func() *engine.Snapshot { return snap }
			switch mode {
			case "cold":
				next = func() *engine.Snapshot { return engine.Build(snap.Revision()+1, ab.resources) }
			case "first":
				next = func() *engine.Snapshot { return snap.Apply(snap.Revision()+1, nil) }
			case "after-policy-change":
				next = func() *engine.Snapshot { return change(snap, false) }
			case "after-new-condition":
				next = func() *engine.Snapshot { return change(snap, true) }
			}
			if _, err := analysis.Reach(snap, &req); err != nil { // the lineage's last Reach
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var entries int
			var cpu time.Duration
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				snap = next()
				runtime.GC() // the garbage of next's build is not the Reach's
				b.StartTimer()
				start := cpuTime()
				ans, err := analysis.Reach(snap, &req)
				cpu += cpuTime() - start
				if err != nil {
					b.Fatal(err)
				}
				entries = len(ans.Entries)
			}
			b.ReportMetric(float64(entries), "entries")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkMatrix answers the allowed pairs among 1k × 1k workloads of a
// 10k-policy set on every class of flows.
func BenchmarkMatrix(b *testing.B) {
	ab := newAnalysisBench(10_000, 1_000)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	var entries, decisions int
	for n := 0; n < b.N; n++ {
		entries = 0
		_, d, err := analysis.Matrix(ab.snap, &analysis.MatrixRequest{Mesh: ab.set.Config.Mesh}, func(analysis.MatrixEntry) bool {
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
	b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkImpact judges a one-policy change (a DENY between two services)
// over 1M observed flows between 10k workloads of a 10k-policy set (the
// inventory's own pairs left out: no workload in the mesh of the flows'
// judgement but those the flows name).
func BenchmarkImpact(b *testing.B) {
	ab := newAnalysisBench(10_000, 10_000)
	flows := ab.bulkFlows(1_000_000)
	observed := make([]analysis.ObservedFlow, len(flows))
	for i, f := range flows {
		p := &ab.flows[f[2]]
		observed[i] = analysis.ObservedFlow{Mesh: ab.set.Config.Mesh, Type: ab.set.Config.Type,
			Source: inventory.Endpoint{Workload: ab.workloads[f[0]].Name}, Destination: inventory.Endpoint{Workload: ab.workloads[f[1]].Name},
			Protocol: p.Protocol, Port: p.Port, Count: 1}
	}
	src, dst := ab.workloads[0].Tags[resource.ServiceTag], ab.workloads[1].Tags[resource.ServiceTag]
	deny := &resource.Policy{Mesh: ab.set.Config.Mesh, Type: ab.set.Config.Type, Name: "deny-one", Action: resource.Deny,
		Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: src}}},
		Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: dst}}}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	var ans *analysis.ImpactAnswer
	for n := 0; n < b.N; n++ {
		var err error
		ans, err = analysis.Impact(ab.snap, &analysis.ImpactRequest{Puts: []resource.Resource{deny}, Flows: observed})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ans.Changes)), "changes")
	b.ReportMetric(float64(ans.Redecided), "redecided")
	b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

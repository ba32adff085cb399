package observed

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// BenchmarkBatch counts batches of 1,000 distinct flows between identities
// into a table, as the compact path does (IdentitiesN): ns per flow.
func BenchmarkBatch(b *testing.B) {
	reg := inventory.NewRegistry(0, 0)
	sets := make([]*inventory.TagSet, 2000)
	for i := range sets {
		s, err := reg.Register("m", resource.Tags{"app": fmt.Sprint(i)})
		if err != nil {
			b.Fatal(err)
		}
		sets[i] = s
	}
	fs := make([]IdentityFlow, 1000)
	for i := range fs {
		fs[i] = IdentityFlow{Src: sets[i], Dst: sets[1000+i], PP: packPort(resource.TCP, 8080)}
	}
	policies := []string{"p"}
	tab := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bt := tab.Batch("m", "", sets[0].Identity())
			bt.IdentitiesN(fs, policies, 1)
			bt.Done()
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/flow")
}

// BenchmarkObserve counts single decisions, as Decide, DecideBatch,
// DecideStream and Check do: 1,000 flows between 1,000 workloads (the
// table in the caches), and 100,000 flows between 16,384 ends given as
// tags, as the load test's batch and stream scenarios send them (the
// table's lines mostly missing the caches).
func BenchmarkObserve(b *testing.B) {
	for _, c := range []struct {
		name         string
		ends, flows  int
		workloadEnds bool
	}{{"workloads=1000/flows=1000", 1000, 1000, true}, {"tags=16384/flows=100000", 16384, 100000, false}} {
		b.Run(c.name, func(b *testing.B) {
			ends := make([]End, c.ends)
			for i := range ends {
				tags := resource.Tags{"app": fmt.Sprint(i), "version": "v1"}
				ends[i] = End{Given: inventory.Endpoint{Tags: tags}, Tags: tags, Identity: resource.Identity("m", tags)}
				if c.workloadEnds {
					ends[i].Given = inventory.Endpoint{Workload: fmt.Sprint("w-", i)}
				}
			}
			tab := New(Config{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				d := Decision{Mesh: "m", Protocol: resource.TCP, Port: 8080, Action: resource.Allow, Policy: "p", Revision: 1}
				x := uint64(1)
				for pb.Next() {
					x = x*0x9E3779B97F4A7C15 + 1 // a flow of c.flows, in no order
					f := int(x>>33) % c.flows
					d.Source, d.Destination = ends[f%c.ends], ends[(f/c.ends*7919+f*31)%c.ends]
					tab.Observe(&d)
				}
			})
		})
	}
}

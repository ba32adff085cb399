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

// BenchmarkObserve counts single decisions of 1,000 distinct flows between
// workloads, as Decide, DecideBatch, DecideStream and Check do.
func BenchmarkObserve(b *testing.B) {
	ends := make([]End, 1000)
	for i := range ends {
		ends[i] = End{Given: inventory.Endpoint{Workload: fmt.Sprint("w-", i)}, Tags: resource.Tags{"app": fmt.Sprint(i)}, Identity: uint64(i + 1)}
	}
	tab := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := Decision{Mesh: "m", Protocol: resource.TCP, Port: 8080, Action: resource.Allow, Policy: "p", Revision: 1}
		i := 0
		for pb.Next() {
			d.Source, d.Destination = ends[i%1000], ends[(i*7)%1000]
			tab.Observe(&d)
			i++
		}
	})
}

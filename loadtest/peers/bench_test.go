package peers

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// BenchmarkDecide decides the generated flows in every peer at every size of
// -sizes (default 1000,10000):
//
//	go test -run '^$' -bench . -timeout 60m                            # 1k and 10k
//	go test -run '^$' -bench . -timeout 60m -args -sizes 1000,10000,100000
//
// Besides ns/op and allocs/op it reports heap-B, the heap the peer keeps after
// loading, and load-s, the time to load it. A peer whose load takes over 5
// minutes or one of whose decisions takes over 10 s is skipped with the figure it
// reached. With the default -benchtime 1s the slowest peers run a handful of
// decisions; every benchmark ends within a few seconds of its first decision.
func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	for _, pr := range Profiles {
		for _, n := range testSizes(b) {
			flows := Flows(pr.Profile, n, 4096)
			for _, p := range Peers() {
				// With b.Loop the function runs once: the load is not repeated and
				// not timed.
				b.Run(fmt.Sprintf("%s/policies=%d/%s", pr.Name, n, p.Name), func(b *testing.B) {
					l, err := Load(ctx, p, pr.Profile, n, 5*time.Minute)
					if err == nil {
						start := time.Now()
						_, err = l.Decider.Decide(&flows[0])
						if el := time.Since(start); err == nil && el > 10*time.Second {
							err = fmt.Errorf("one decision took %s: %w", el.Round(time.Millisecond), ErrTooSlow)
						}
					}
					if err != nil {
						b.Skipf("not measured: %v", err)
					}
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						if _, err := l.Decider.Decide(&flows[i%len(flows)]); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(l.Heap), "heap-B")
					b.ReportMetric(l.LoadTime.Seconds(), "load-s")
				})
				runtime.GC()
			}
		}
	}
}

// BenchmarkOPAFloor is the rules formulation with no rule at all: the cost of
// one prepared evaluation with this input, whatever the policies.
func BenchmarkOPAFloor(b *testing.B) {
	d, err := NewOPARules(context.Background(), &Program{DefaultAction: resource.Deny})
	if err != nil {
		b.Fatal(err)
	}
	flows := Flows(policygen.Sparse, 1000, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := d.Decide(&flows[i%len(flows)]); err != nil {
			b.Fatal(err)
		}
	}
}

package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// BenchmarkWatchRulesAddressSetFanout: 2,000 agents watch their workloads'
// rules with address sets over bufconn; half of them (tier front) have an
// inbound rule whose peer is {role: client}, the other half a rule whose peer
// is {role: admin}. Each op adds one client workload: every front agent must
// receive the delta adding its address; the back agents must receive nothing.
// Reported: p50-ms and p99-ms from the write to each front agent's receipt
// (all ops), and unaffected-msgs, the messages back agents received after
// their first (must be 0). Issue 13 item 5's target: p99 ≤ 1 s.
func BenchmarkWatchRulesAddressSetFanout(b *testing.B) {
	b.ReportAllocs()
	const agents = 2000
	policies := `kind: Policy
name: clients-to-front
sources: [{match: {role: client}}]
destinations: [{match: {tier: front}}]
---
kind: Policy
name: admins-to-back
sources: [{match: {role: admin}}]
destinations: [{match: {tier: back}}]
`
	h := start(b, newBackend(decodeYAML(b, policies)...), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var workloads []*verdictv1.Resource
	for i := range agents {
		workloads = append(workloads, wl(fmt.Sprintf("agent-%d", i),
			map[string]string{"app": fmt.Sprintf("a%d", i), "tier": []string{"front", "back"}[i%2]},
			fmt.Sprintf("10.%d.%d.1", i/250, i%250)))
		if len(workloads) == 100 || i == agents-1 { // within one transaction's limit
			if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: workloads}); err != nil {
				b.Fatal(err)
			}
			workloads = nil
		}
	}

	var (
		mu         sync.Mutex
		latencies  []time.Duration
		unaffected atomic.Int64
		wrote      atomic.Int64 // UnixNano of the current op's write
		want       atomic.Value // the address the current op adds
		pending    sync.WaitGroup
	)
	ready := make(chan error, agents)
	for i := range agents {
		front := i%2 == 0
		go func() {
			s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{
				Workload: &verdictv1.Endpoint{Workload: fmt.Sprintf("agent-%d", i)}, AddressSets: true})
			if err == nil {
				_, err = s.Recv()
			}
			ready <- err
			if err != nil {
				return
			}
			for {
				m, err := s.Recv()
				if err != nil {
					return
				}
				if !front {
					unaffected.Add(1)
					continue
				}
				for _, d := range m.GetSetDeltas() {
					if slices.Contains(d.GetAdded(), want.Load().(string)) {
						at := time.Since(time.Unix(0, wrote.Load()))
						mu.Lock()
						latencies = append(latencies, at)
						mu.Unlock()
						pending.Done()
					}
				}
			}
		}()
	}
	for range agents {
		if err := <-ready; err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for n := range b.N {
		addr := fmt.Sprintf("172.16.%d.%d", n/250, n%250+1)
		want.Store(addr)
		pending.Add(agents / 2)
		wrote.Store(time.Now().UnixNano())
		if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
			wl(fmt.Sprintf("client-%d", n), map[string]string{"role": "client"}, addr)}}); err != nil {
			b.Fatal(err)
		}
		pending.Wait()
	}
	b.StopTimer()
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(unaffected.Load()), "unaffected-msgs")
}

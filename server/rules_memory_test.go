package server

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// TestWatchRulesMemoryPerStream: idle reading WatchRules streams of distinct
// workloads, each with the 402 rules of 201 policies that match every
// workload, cost at most 64 KiB of live heap each, client and server
// together (docs/api.md, "Limits"): equal rules are held once, and rules
// that differ per workload are held encoded, once per workload. Measured as
// the heap after a GC with the streams open less the heap before they
// opened. Sequential: it reads the whole process's heap.
func TestWatchRulesMemoryPerStream(t *testing.T) {
	const streams, perStream = 300, 64 << 10
	for _, tc := range []struct {
		name string
		own  bool // a policy of each workload's own beside the 201 shared
	}{
		{"equal rules", false},
		{"rules that differ per workload", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var docs strings.Builder
			docs.WriteString("kind: Mesh\nname: default\n")
			for i := range 201 {
				fmt.Fprintf(&docs, "---\nkind: Policy\nname: p-%03d\nsources: [{match: {kuma.io/service: '*'}}]\ndestinations: [{match: {kuma.io/service: '*'}}]\n", i)
			}
			if tc.own {
				for i := range streams {
					fmt.Fprintf(&docs, "---\nkind: Policy\nname: own-%03d\nsources: [{match: {kuma.io/service: peer-%d}}]\ndestinations: [{match: {kuma.io/service: svc-%d}}]\n", i, i, i)
				}
			}
			b := newBackend()
			rs := decodeYAML(t, docs.String())
			for len(rs) > 0 { // one transaction holds at most 128 writes
				n := min(len(rs), 100)
				ops := make([]store.Op, n)
				for i, r := range rs[:n] {
					ops[i] = store.Op{Key: r.Key(), Resource: r}
				}
				if _, err := b.Apply(t.Context(), ops); err != nil {
					t.Fatal(err)
				}
				rs = rs[n:]
			}
			h := start(t, b, nil)
			defer h.stop()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// The streams' connections (100 streams each) are made before the
			// baseline: a connection's buffers (bufconn's pipes alone are 2
			// MiB) are not a stream's.
			conns := make([]verdictv1.WatchServiceClient, (streams+99)/100)
			for i := range conns {
				conn := h.dial()
				if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
				conns[i] = verdictv1.NewWatchServiceClient(conn)
			}
			before := liveHeap()
			open := make([]grpc.ServerStreamingClient[verdictv1.WatchRulesResponse], 0, streams)
			for i := range streams {
				s, err := conns[i/100].WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("kuma.io/service", fmt.Sprintf("svc-%d", i))})
				if err != nil {
					t.Fatal(err)
				}
				m, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				want := 201
				if tc.own {
					want++
				}
				if n := len(m.GetInbound().GetRules()); n != want {
					t.Fatalf("stream %d: %d inbound rules, want %d", i, n, want)
				}
				open = append(open, s)
			}
			after := liveHeap()
			per := (int64(after) - int64(before)) / streams
			t.Logf("%d streams: live heap %d KiB before, %d KiB after: %d bytes per stream", streams, before>>10, after>>10, per)
			if per > perStream {
				t.Errorf("%d bytes of live heap per idle reading stream, want at most %d", per, perStream)
			}
			runtime.KeepAlive(open)
		})
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

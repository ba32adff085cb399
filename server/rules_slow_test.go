package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestWatchRulesDropsSlowConsumers: streams that never read are dropped with
// RESOURCE_EXHAUSTED once an update waits RulesMaxLag behind their unread
// messages, counted in verdict_watch_dropped_total{rpc="WatchRules"}; an
// honest watcher beside them (on another connection) gets every update
// (2,000 non-reading streams held 540 MiB when they were never dropped;
// scaled down here). Sequential:
// goleak checks that the dropped streams leave nothing behind.
func TestWatchRulesDropsSlowConsumers(t *testing.T) {
	check := leakBaseline(t)
	defer check()
	const slow, writes = 100, 30
	long := strings.Repeat("n", 200)
	var docs strings.Builder
	docs.WriteString("kind: Mesh\nname: default\n")
	for i := range 40 { // about 10 KB of rules for app=web
		fmt.Fprintf(&docs, "---\nkind: Policy\nname: p%02d-%s\nsources: [{match: {app: '*'}}]\ndestinations: [{match: {app: web}}]\n", i, long)
	}
	reader := sdkmetric.NewManualReader()
	b := newBackend(decodeYAML(t, docs.String())...)
	h := start(t, b, func(c *Config) {
		c.RulesMaxLag = 100 * time.Millisecond
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	}, grpc.WithInitialWindowSize(64<<10)) // as gRPC starts: no window growth (BDP) to hide the backlog in the client
	defer h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := &verdictv1.WatchRulesRequest{Workload: tags("app", "web")}
	honest, err := h.wat.WatchRules(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := honest.Recv(); err != nil {
		t.Fatal(err)
	}
	// The slow streams share a connection of their own: a dropped consumer's
	// connection is closed.
	slowConn := h.dial()
	defer slowConn.Close() // before the leak check
	slowWat := verdictv1.NewWatchServiceClient(slowConn)
	var slowStreams []verdictv1.WatchService_WatchRulesClient
	for range slow {
		s, err := slowWat.WatchRules(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		slowStreams = append(slowStreams, s)
	}
	waitWatchers(ctx, t, h, "all streams registered", slow+1)

	write := func(i int) {
		t.Helper()
		ap, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
			policyRes(&verdictv1.Policy{Name: fmt.Sprintf("w%02d-%s", i, long),
				Sources:      []*verdictv1.Selector{{Match: map[string]string{"app": "*"}}},
				Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "web"}}}})}})
		if err != nil {
			t.Fatal(err)
		}
		for { // the honest watcher gets the update
			m, err := honest.Recv()
			if err != nil {
				t.Fatalf("honest watcher after write %d: %v", i, err)
			}
			if m.GetRevision() >= ap.GetRevision() {
				return
			}
		}
	}
	for i := range writes {
		write(i)
	}
	// The slow streams fall behind (their ~300 KB of updates outgrow the
	// flow-control windows) and are dropped; the honest one stays.
	waitWatchers(ctx, t, h, "slow streams dropped", 1)
	write(writes)

	for i, s := range slowStreams {
		var err error
		for err == nil {
			_, err = s.Recv()
		}
		// RESOURCE_EXHAUSTED when the stream's end reached the client before
		// its connection closed, UNAVAILABLE otherwise.
		switch st, _ := status.FromError(err); st.Code() {
		case codes.ResourceExhausted:
			if !strings.Contains(st.Message(), "reconnect") {
				t.Errorf("slow stream %d: %v", i, st.Message())
			}
		case codes.Unavailable:
		default:
			t.Errorf("slow stream %d ended with %v, want RESOURCE_EXHAUSTED or UNAVAILABLE", i, err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	// Each drop closes the connection, which ends the slow streams not yet
	// dropped (UNAVAILABLE to the client, not counted).
	if got := droppedCount(rm, "WatchRules"); got < 1 || got > slow {
		t.Errorf("verdict_watch_dropped_total{rpc=WatchRules} = %d, want 1 to %d", got, slow)
	}
}

func droppedCount(rm metricdata.ResourceMetrics, rpc string) int64 {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "verdict.watch.dropped" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("rpc")); v.AsString() == rpc {
					return dp.Value
				}
			}
		}
	}
	return 0
}

// waitWatchers waits until the rules hub holds n watchers, failing the test
// (with the count it saw) when ctx ends first.
func waitWatchers(ctx context.Context, t *testing.T, h *harness, what string, n int) {
	t.Helper()
	for h.srv.hub.Stats().Streams != n {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %d streams registered, want %d", what, h.srv.hub.Stats().Streams, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

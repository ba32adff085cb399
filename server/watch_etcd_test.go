package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// etcdMetric reads one of the embedded member's own metrics: etcd registers
// them on the default Prometheus registry, and this is the only member of the
// test binary.
func etcdMetric(t *testing.T, name string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("etcd has no metric %s", name)
	return 0
}

// TestWatchResourcesCostEtcdNothingPerStream: on real etcd, hundreds of
// WatchResources streams and a storm of streams opened and cancelled at once
// leave etcd with the syncer's one watch, cost it no read, and leave no
// goroutine behind (in the server or in etcd, which runs in this process).
// Not parallel: it reads process-wide metrics and goroutines.
func TestWatchResourcesCostEtcdNothingPerStream(t *testing.T) {
	const streams, storm = 500, 500
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// The syncer's one watch must not be restarted during the test (a restart
	// re-lists and replaces its goroutines): liveness checks far apart.
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints(), ProgressInterval: time.Minute, LivenessTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sy, err := syncer.New(syncer.Config{Store: st, StaleAfter: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	syncCtx, stopSync := context.WithCancel(ctx)
	synced := make(chan error, 1)
	go func() { synced <- sy.Run(syncCtx) }()
	defer func() { stopSync(); <-synced }()
	h := start(t, nil, func(c *Config) { c.Syncer, c.Store = sy, st })
	defer h.stop()

	seed := &verdictv1.ApplyRequest{}
	for i := range 20 {
		seed.Resources = append(seed.Resources, sdPolicy(fmt.Sprintf("p%d", i), "web", "api", ""))
	}
	applied, err := h.pol.Apply(ctx, seed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sy.WaitFor(ctx, applied.GetRevision()); err != nil {
		t.Fatal(err)
	}
	// The first stream waits for the server's feed to be ready.
	first, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, first, 2)

	watchers := etcdMetric(t, "etcd_debugging_mvcc_watcher_total")
	watchStreams := etcdMetric(t, "etcd_debugging_mvcc_watch_stream_total")
	ranges := etcdMetric(t, "etcd_mvcc_range_total")
	if watchers != 1 {
		t.Errorf("%v etcd watchers before the streams, want the syncer's one", watchers)
	}
	checkLeaks := leakBaseline(t)
	began := time.Now()

	// Hundreds of streams, each from a snapshot (half under a prefix).
	sctx, cancelStreams := context.WithCancel(ctx)
	open := make([]verdictv1.WatchService_WatchResourcesClient, streams)
	var wg sync.WaitGroup
	errs := make(chan error, streams+storm)
	for i := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prefix := []string{"", "default/policies/"}[i%2]
			s, err := h.wat.WatchResources(sctx, &verdictv1.WatchResourcesRequest{Prefix: prefix})
			if err == nil {
				for range 2 { // a snapshot of one part, and SYNCED
					if _, err = s.Recv(); err != nil {
						break
					}
				}
			}
			if err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
			}
			open[i] = s
		}()
	}
	wg.Wait()
	t.Logf("%d streams open in %v", streams, time.Since(began))
	if got := etcdMetric(t, "etcd_debugging_mvcc_watcher_total"); got != watchers {
		t.Errorf("%v etcd watchers with %d streams open, want %v", got, streams, watchers)
	}
	// A stream of its own would cost one range each; allow a few reads
	// of the store itself.
	if got := etcdMetric(t, "etcd_mvcc_range_total") - ranges; got >= streams/10 {
		t.Errorf("%v etcd ranges for %d streams, want none of theirs", got, streams)
	}

	// A write reaches every stream.
	put, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("late", "a", "b", "")}})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range open {
		if s == nil {
			continue
		}
		m, err := s.Recv()
		if err != nil || m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES || m.GetRevision() != put.GetRevision() {
			t.Fatalf("stream %d after the write: %v %v", i, m, err)
		}
	}
	ranges = etcdMetric(t, "etcd_mvcc_range_total") // the write itself may read

	// The storm: streams opened and cancelled at once, from a snapshot or a
	// resume, while the others are cancelled too.
	for i := range storm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, stop := context.WithCancel(ctx)
			defer stop()
			from := []int64{0, applied.GetRevision(), 1}[i%3]
			s, err := h.wat.WatchResources(c, &verdictv1.WatchResourcesRequest{FromRevision: from})
			if err == nil && i%2 == 0 {
				_, err = s.Recv()
			}
			if err != nil && c.Err() == nil {
				errs <- fmt.Errorf("storm stream %d: %w", i, err)
			}
		}()
	}
	cancelStreams()
	wg.Wait()
	t.Logf("storm done at %v", time.Since(began))
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := etcdMetric(t, "etcd_mvcc_range_total") - ranges; got >= storm/10 {
		t.Errorf("%v etcd ranges for a storm of %d streams, want none of theirs", got, storm)
	}
	checkLeaks() // every handler ended, and etcd holds no watch goroutine for them
	t.Logf("no leak at %v", time.Since(began))
	if got := etcdMetric(t, "etcd_debugging_mvcc_watcher_total"); got != watchers {
		t.Errorf("%v etcd watchers after the storm, want %v", got, watchers)
	}
	if got := etcdMetric(t, "etcd_debugging_mvcc_watch_stream_total"); got != watchStreams {
		t.Errorf("%v etcd watch streams after the storm, want %v", got, watchStreams)
	}
}

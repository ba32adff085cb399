package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/listen"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/storetest"
	"github.com/verdictpdp/verdict/store/syncer"
	"github.com/verdictpdp/verdict/store/syncer/syncertest"
)

func TestMain(m *testing.M) {
	var opts []goleak.Option
	for _, f := range embedetcd.Lingering() {
		opts = append(opts, goleak.IgnoreAnyFunction(f))
	}
	goleak.VerifyTestMain(m, opts...)
}

// logger shows the store's warnings with -v when VERDICT_TEST_LOG is set.
func logger() *slog.Logger {
	if os.Getenv("VERDICT_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func startEtcd(t testing.TB) *embedetcd.Etcd {
	t.Helper()
	e, err := embedetcd.Start(storetest.Context(t), embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// newStore is a store with quick liveness checks, closed with the test.
func newStore(t testing.TB, endpoints []string) *etcd.Store {
	t.Helper()
	st, err := etcd.New(storetest.Context(t), etcd.Config{
		Endpoints:        endpoints,
		DialTimeout:      2 * time.Second,
		RequestTimeout:   2 * time.Second,
		ProgressInterval: 100 * time.Millisecond,
		LivenessTimeout:  time.Second,
		Logger:           logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// harness: the store under test reaches etcd through a proxy that Interrupt
// cuts; the writer and the raw client go direct.
func harness(t *testing.T) storetest.Harness {
	return harnessWith(t, func(endpoints []string) store.Store { return newStore(t, endpoints) })
}

// harnessWith is harness with the store under test made by open.
func harnessWith(t *testing.T, open func(endpoints []string) store.Store) storetest.Harness {
	e := startEtcd(t)
	p, err := embedetcd.NewProxy(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	st := open([]string{p.Endpoint()})
	writer := newStore(t, e.Endpoints())
	raw := writer.Client()
	return storetest.Harness{
		Store:  st,
		Writer: writer,
		RawPut: func(ctx context.Context, path string, value []byte) (int64, error) {
			resp, err := raw.Put(ctx, store.DefaultPrefix+"/"+path, string(value))
			if err != nil {
				return 0, err
			}
			return resp.Header.Revision, nil
		},
		RawDelete: func(ctx context.Context, path string) (int64, error) {
			resp, err := raw.Delete(ctx, store.DefaultPrefix+"/"+path)
			if err != nil {
				return 0, err
			}
			return resp.Header.Revision, nil
		},
		Compact: func(ctx context.Context, rev int64) error {
			_, err := raw.Compact(ctx, rev, clientv3.WithCompactPhysical())
			return err
		},
		Interrupt: func() func() {
			p.Cut()
			return p.Restore
		},
	}
}

func TestContract(t *testing.T) { storetest.Run(t, harness) }

// lazyHarness is harness with the store under test reached through Connect.
func lazyHarness(t *testing.T) storetest.Harness {
	return harnessWith(t, func(endpoints []string) store.Store {
		l := etcd.Connect(storetest.Context(t), etcd.Config{
			Endpoints:        endpoints,
			DialTimeout:      2 * time.Second,
			RequestTimeout:   2 * time.Second,
			ProgressInterval: 100 * time.Millisecond,
			Logger:           logger(),
		})
		t.Cleanup(func() { l.Close() })
		select {
		case <-l.Ready():
		case <-time.After(30 * time.Second):
			t.Fatal("Connect: not ready after 30s")
		}
		return l
	})
}

func TestLazyContract(t *testing.T) { storetest.Run(t, lazyHarness) }

func TestSyncerContract(t *testing.T) { syncertest.Run(t, harness) }

func TestConfigValidate(t *testing.T) {
	ok := etcd.Config{Endpoints: []string{"http://127.0.0.1:2379"}}
	tests := []struct {
		name string
		edit func(*etcd.Config)
		ok   bool
	}{
		{"endpoints are enough", func(*etcd.Config) {}, true},
		{"host:port endpoints", func(c *etcd.Config) { c.Endpoints = []string{"etcd-0:2379", "etcd-1:2379"} }, true},
		{"no endpoint", func(c *etcd.Config) { c.Endpoints = nil }, false},
		{"an endpoint without port", func(c *etcd.Config) { c.Endpoints = []string{"etcd"} }, false},
		{"an unknown scheme", func(c *etcd.Config) { c.Endpoints = []string{"ftp://x:1"} }, false},
		{"a prefix without leading slash", func(c *etcd.Config) { c.Prefix = "verdict" }, false},
		{"a prefix with a trailing slash", func(c *etcd.Config) { c.Prefix = "/verdict/" }, false},
		{"a negative timeout", func(c *etcd.Config) { c.RequestTimeout = -time.Second }, false},
		{"liveness within the progress interval", func(c *etcd.Config) {
			c.ProgressInterval, c.LivenessTimeout = time.Second, time.Second
		}, false},
		{"a username without password", func(c *etcd.Config) { c.Username = "verdict" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			err := c.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, etcd.ErrInvalidConfig) {
				t.Fatalf("%v is not ErrInvalidConfig", err)
			}
		})
	}
}

func TestNewFailsWhenEtcdDoesNotAnswer(t *testing.T) {
	ports, err := listen.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = etcd.New(context.Background(), etcd.Config{Endpoints: []string{embedetcd.LoopbackURL(ports[0])}, DialTimeout: 300 * time.Millisecond})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("New without etcd: %v, want ErrUnavailable", err)
	}
}

// A watch that goes silent without an error (a partition, a hung member) is
// noticed by the liveness check: the store says it is disconnected, and
// re-lists once etcd answers again.
func TestSilentWatchIsNoticed(t *testing.T) {
	e := startEtcd(t)
	p, err := embedetcd.NewProxy(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	st := newStore(t, []string{p.Endpoint()})
	writer := newStore(t, e.Endpoints())
	storetest.ApplyMany(t, writer, storetest.Policies(t, "default", "p", 100))
	sy := syncertest.StartSyncer(t, st, syncer.Config{StaleAfter: 5 * time.Second})

	p.Blackhole()
	storetest.Eventually(t, "the store to notice the silence", func() bool { return !st.Health().Connected })
	if !sy.Stale() {
		t.Fatal("the syncer is not stale while the store is disconnected")
	}
	last := storetest.ApplyMany(t, writer, storetest.Policies(t, "default", "q", 100))
	p.Restore()
	snap := syncertest.WaitFor(t, sy, last)
	if snap.Digest() != storetest.Digest(t, writer) {
		t.Fatal("after the silence the snapshot differs from etcd")
	}
	storetest.Eventually(t, "the store to be connected again", func() bool { return st.Health().Connected })
}

// etcd confirms a watch before the client returns it: a member that hangs
// then must not hang the watch for good.
func TestWatchCreatedOnASilentEtcd(t *testing.T) {
	e := startEtcd(t)
	p, err := embedetcd.NewProxy(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	st := newStore(t, []string{p.Endpoint()})
	writer := newStore(t, e.Endpoints())
	rev := storetest.Apply(t, writer, storetest.Put(storetest.Policy(t, "default", "a", 0)))

	p.Blackhole()
	f := storetest.Follow(t, st, rev) // straight to a watch, no list first
	storetest.Eventually(t, "the store to notice the silence", func() bool { return !st.Health().Connected })
	last := storetest.Apply(t, writer, storetest.Put(storetest.Policy(t, "default", "b", 0)))
	p.Restore()
	f.WaitRevision(t, last)
	// The watch either resumed (its creation went through once etcd was
	// heard again: the follower, started at rev with nothing, holds exactly
	// the change after it) or was replaced by a re-list (a Reset: then it
	// holds what etcd holds). Either way nothing after rev is lost.
	snap := f.Snapshot()
	if f.Resets() > 0 {
		if snap.Digest() != storetest.Digest(t, writer) {
			t.Fatal("the re-listed watch differs from etcd")
		}
		return
	}
	if _, ok := snap.Get(resource.Key{Kind: resource.KindPolicy, Mesh: "default", Type: resource.DefaultType, Name: "b"}); !ok || snap.Len() != 1 {
		t.Fatalf("the resumed watch holds %d resources, want the one written after rev (b)", snap.Len())
	}
}

// etcd stopped for several seconds, then restarted: the last snapshot keeps
// serving, the store and the syncer report it stale, and after the restart
// everything is caught up, including writes the watch had not delivered yet.
func TestEtcdStoppedAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("stops etcd for seconds: skipped under -short")
	}
	ctx := storetest.Context(t)
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	sy := syncertest.StartSyncer(t, st, syncer.Config{StaleAfter: 2 * time.Second})
	storetest.ApplyMany(t, st, storetest.Policies(t, "default", "p", 500))

	// Stop right after a burst: some of it may not have reached the watch.
	storetest.ApplyMany(t, st, storetest.Policies(t, "default", "burst", 300))
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, "the store to report itself disconnected", func() bool { return !st.Health().Connected })
	storetest.Eventually(t, "the syncer to report itself stale", sy.Stale)
	served := sy.Snapshot()
	time.Sleep(3 * time.Second)
	if sy.Snapshot() != served {
		t.Fatal("the snapshot changed while etcd was down")
	}
	if !sy.Stale() || !sy.Synced() {
		t.Fatalf("while etcd is down: status %+v", sy.Status())
	}
	if _, err := st.Apply(ctx, []store.Op{storetest.Put(storetest.Policy(t, "default", "lost", 0))}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Apply while etcd is down: %v, want ErrUnavailable", err)
	}

	if err := e.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The client reconnects within its backoff (at most about 2 s).
	storetest.Eventually(t, "the store to reconnect", func() bool { return st.Health().Connected })
	var last int64
	for _, r := range storetest.Policies(t, "default", "after", 100) {
		last = applyRetrying(t, st, storetest.Put(r))
	}
	snap := syncertest.WaitFor(t, sy, last)
	if snap.Len() != 900 {
		t.Fatalf("after the restart the snapshot holds %d resources, want 900", snap.Len())
	}
	if snap.Digest() != storetest.Digest(t, st) {
		t.Fatal("after the restart the snapshot differs from etcd")
	}
	storetest.Eventually(t, "the syncer to be current again", func() bool { return !sy.Stale() })
}

// In a 3-member cluster, members are stopped one at a time, the leader first:
// the watch goes on through another member and no update is lost.
func TestClusterMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster: skipped under -short")
	}
	// Three starts, stops and restarts of members and 500 writes share this
	// deadline: a safety net sized for a busy machine, not a timing.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := embedetcd.StartCluster(ctx, 3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	st := newStore(t, cl.Endpoints())
	writer := newStore(t, cl.Endpoints())
	sy := syncertest.StartSyncer(t, st, syncer.Config{StaleAfter: 5 * time.Second})
	storetest.ApplyMany(t, writer, storetest.Policies(t, "default", "p", 200))

	order := []int{cl.Leader()}
	for i := range cl.Members {
		if i != order[0] {
			order = append(order, i)
		}
	}
	for round, i := range order {
		if err := cl.Members[i].Stop(); err != nil {
			t.Fatal(err)
		}
		var last int64
		for j := range 100 {
			last = applyRetrying(t, writer, storetest.Put(storetest.Policy(t, "default", fmt.Sprintf("r%d-%03d", round, j), j)))
		}
		snap := syncertest.WaitFor(t, sy, last)
		if snap.Digest() != storetest.Digest(t, writer) {
			t.Fatalf("round %d (member %d stopped): the snapshot differs from etcd", round, i)
		}
		if err := cl.Members[i].Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := sy.Snapshot().Len(); n != 500 {
		t.Fatalf("the snapshot holds %d resources, want 500", n)
	}
}

// applyRetrying retries an Apply that found no leader (a proposal in flight
// when a leader dies is lost and times out).
func applyRetrying(t testing.TB, st store.Store, ops ...store.Op) int64 {
	t.Helper()
	var err error
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var rev int64
		rev, err = st.Apply(ctx, ops)
		cancel()
		if err == nil {
			return rev
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatal(err)
		}
	}
	t.Fatalf("apply: %v", err)
	return 0
}

// A watch that stops hearing from etcd — a blackholed connection, or a
// member that refuses connections, which the client quietly keeps
// redialling — makes the store report itself disconnected (so Status says
// stale) after one and a half progress intervals, long before the liveness
// timeout replaces the watch; it is connected again when the watch hears from
// etcd again. (Found by the chaos run: a replica cut off for 3 s served a
// stale snapshot while Status said it was current.)
func TestQuietWatchReportsDisconnected(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(e *embedetcd.Etcd, p *embedetcd.Proxy) (heal func())
	}{
		{"blackholed", func(_ *embedetcd.Etcd, p *embedetcd.Proxy) func() { p.Blackhole(); return p.Restore }},
		// As a stopped member looks from the client: connections reset and
		// refused, which the etcd client redials without a word.
		{"connections refused", func(_ *embedetcd.Etcd, p *embedetcd.Proxy) func() { p.Cut(); return p.Restore }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEtcd(t)
			p, st := quietStore(t, e)
			rev := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 0)))
			f := storetest.Follow(t, st, 0)
			f.WaitRevision(t, rev)
			storetest.Eventually(t, "the store to be connected", func() bool { return st.Health().Connected })

			heal := tc.cut(e, p)
			storetest.Eventually(t, "the store to report the quiet watch", func() bool { return !st.Health().Connected })
			heal()
			// The etcd client resumes the watch after the last revision it
			// saw, and etcd sends no progress to a watch that starts beyond
			// its revision: on an idle etcd the resumed watch hears nothing
			// until the next write (or until the liveness timeout replaces
			// it). A write by another client, then: the store's own calls
			// would count as hearing from etcd.
			writer := newStore(t, e.Endpoints())
			last := storetest.Apply(t, writer, storetest.Put(storetest.Policy(t, "default", "b", 0)))
			f.WaitRevision(t, last)
			storetest.Eventually(t, "the store to be connected again", func() bool { return st.Health().Connected })
		})
	}
}

// TestQuietWatchCreationReportsDisconnected: a watch whose creation waits on
// an etcd that went silent (here: a resume from a revision, which lists
// nothing first) says so after one and a half progress intervals, as a
// running watch does; it used to leave the store connected until the liveness
// timeout replaced it (found under load: TestQuietWatchReportsDisconnected's
// blackhole fell between the list and the watch's creation, and waited an
// hour's liveness timeout).
func TestQuietWatchCreationReportsDisconnected(t *testing.T) {
	e := startEtcd(t)
	p, st := quietStore(t, e)
	rev := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 0)))
	storetest.Eventually(t, "the store to be connected", func() bool { return st.Health().Connected })

	p.Blackhole()
	f := storetest.Follow(t, st, rev) // no list: straight to the watch's creation, which waits
	// Far longer than the 150 ms it takes, far shorter than the liveness
	// timeout the old code waited for: a bound on a wait, not a timing.
	for deadline := time.Now().Add(30 * time.Second); st.Health().Connected; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the store still says connected 30 s into a silent watch creation")
		}
	}
	p.Restore()
	writer := newStore(t, e.Endpoints())
	last := storetest.Apply(t, writer, storetest.Put(storetest.Policy(t, "default", "b", 0)))
	f.WaitRevision(t, last)
	storetest.Eventually(t, "the store to be connected again", func() bool { return st.Health().Connected })
}

// TestApplyAnswersBeforeTheCallerGivesUp: with etcd down, an Apply whose
// caller has less time than RequestTimeout fails with ErrUnavailable while
// the caller still waits (a tenth of its time early), so the API answers
// UNAVAILABLE, not the client's own DEADLINE_EXCEEDED (issue 12, minor).
func TestApplyAnswersBeforeTheCallerGivesUp(t *testing.T) {
	e := startEtcd(t)
	st, err := etcd.New(storetest.Context(t), etcd.Config{Endpoints: e.Endpoints(), RequestTimeout: time.Minute, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	// The first call may fail at once on the broken connection; the next
	// ones wait for a connection (the client's calls wait for one) until
	// their deadline.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = st.Apply(ctx, []store.Op{storetest.Put(storetest.Policy(t, "default", "p", 0))})
		if !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("Apply %d with etcd down: %v (the caller's context: %v); want ErrUnavailable before the caller's deadline", i, err, ctx.Err())
		}
		cancel()
	}
	if st.Health().Connected {
		t.Fatal("Health still says connected")
	}
}

// quietStore is a store reaching e through a proxy the test can cut, with
// progress asked every 100 ms and a liveness timeout of an hour: only the
// quiet watch can say the store is cut off.
func quietStore(t *testing.T, e *embedetcd.Etcd) (*embedetcd.Proxy, *etcd.Store) {
	t.Helper()
	p, err := embedetcd.NewProxy(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	st, err := etcd.New(storetest.Context(t), etcd.Config{Endpoints: []string{p.Endpoint()}, DialTimeout: 2 * time.Second,
		RequestTimeout: 2 * time.Second, ProgressInterval: 100 * time.Millisecond, LivenessTimeout: time.Hour, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return p, st
}

// TestApplyWithCurrentReadsNothing: a write whose ops say what their keys
// hold (store.Op.Current, from the server's snapshot) is one transaction, with
// no read before it; a stale Current costs the read (and a second
// transaction), as does none. The suite's "a stale Current changes no
// outcome" holds the results.
func TestApplyWithCurrentReadsNothing(t *testing.T) {
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	ctx := storetest.Context(t)
	p := storetest.Policy(t, "default", "p", 0)
	rev := storetest.Apply(t, st, storetest.Put(p))
	it, err := st.Get(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	created := it.Resource.Metadata().CreationTime
	steps := []struct {
		name  string
		cur   *store.Current
		reads int64
	}{
		{"a current Current", &store.Current{ModRevision: rev, CreationTime: created}, 0},
		{"a stale Current", &store.Current{ModRevision: rev, CreationTime: created}, 1}, // rev was the previous write's
		{"none", nil, 1},
		{"a create, its key absent", &store.Current{}, 0},
	}
	for i, s := range steps {
		r := storetest.Policy(t, "default", "p", i+1)
		if s.name == "a create, its key absent" {
			r = storetest.Policy(t, "default", "q", 0)
		}
		before := st.ApplyReads()
		if _, err := st.Apply(ctx, []store.Op{{Key: r.Key(), Resource: r, Current: s.cur}}); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := st.ApplyReads() - before; got != s.reads {
			t.Errorf("%s: %d reads before the transaction, want %d", s.name, got, s.reads)
		}
	}
}

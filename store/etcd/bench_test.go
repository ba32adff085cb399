package etcd_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// The store's figures (store/README.md):
//
//	go test -run '^$' -bench . -benchtime 3x ./store/etcd/
//
// against an embedded single-member etcd on loopback, with fsync on unless a
// benchmark's name says fsync=off.

func benchEtcd(b *testing.B, noFsync bool) *embedetcd.Etcd {
	b.Helper()
	e, err := embedetcd.Start(context.Background(), embedetcd.Config{Dir: b.TempDir(), NoFsync: noFsync})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

func benchStore(b *testing.B, e *embedetcd.Etcd) *etcd.Store {
	b.Helper()
	st, err := etcd.New(context.Background(), etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

func benchSyncer(b *testing.B, st store.Store) (*syncer.Syncer, func()) {
	b.Helper()
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sy.Run(ctx)
	}()
	for !sy.Synced() {
		time.Sleep(time.Millisecond)
	}
	return sy, func() { cancel(); <-done }
}

func load(b *testing.B, st store.Store, rs []resource.Resource) int64 {
	b.Helper()
	var rev int64
	for i := 0; i < len(rs); i += store.MaxOps {
		var ops []store.Op
		for _, r := range rs[i:min(i+store.MaxOps, len(rs))] {
			ops = append(ops, store.Op{Resource: r})
		}
		var err error
		if rev, err = st.Apply(context.Background(), ops); err != nil {
			b.Fatal(err)
		}
	}
	return rev
}

func waitRev(b *testing.B, sy *syncer.Syncer, rev int64) *engine.Snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	snap, err := sy.WaitFor(ctx, rev)
	if err != nil {
		b.Fatal(err)
	}
	return snap
}

// BenchmarkColdStart: a new store and syncer on etcd holding n policies, until
// the first snapshot is built (paginated list at one revision + decode +
// index). Target at 100k: ≤ 2 s.
func BenchmarkColdStart(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			e := benchEtcd(b, true) // loading only; the list reads
			loader := benchStore(b, e)
			load(b, loader, policygen.Generate(policygen.Config{Seed: 1, Policies: n, Scopes: 50}).Resources)
			b.ResetTimer()
			for b.Loop() {
				st, err := etcd.New(context.Background(), etcd.Config{Endpoints: e.Endpoints()})
				if err != nil {
					b.Fatal(err)
				}
				sy, stop := benchSyncer(b, st)
				if got := sy.Snapshot().Len(); got < n {
					b.Fatalf("synced with %d resources, want %d", got, n)
				}
				b.StopTimer()
				stop()
				st.Close()
				b.StartTimer()
			}
		})
	}
}

// BenchmarkColdStartPhases splits a cold start at 100k policies: the store's
// paginated list and decode (until its Reset event), then the engine's index
// of the Reset (one Snapshot.Apply).
func BenchmarkColdStartPhases(b *testing.B) {
	e := benchEtcd(b, true)
	loader := benchStore(b, e)
	load(b, loader, policygen.Generate(policygen.Config{Seed: 1, Policies: 100_000, Scopes: 50}).Resources)
	var list, index time.Duration
	for b.Loop() {
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		ev := <-loader.Watch(ctx, 0)
		listed := time.Now()
		snap := engine.Empty().Apply(ev.Revision, ev.Changes)
		index += time.Since(listed)
		list += listed.Sub(start)
		cancel()
		if snap.Len() < 100_000 {
			b.Fatalf("%d resources", snap.Len())
		}
	}
	b.ReportMetric(float64(list.Milliseconds())/float64(b.N), "list-ms")
	b.ReportMetric(float64(index.Milliseconds())/float64(b.N), "index-ms")
}

// BenchmarkPutVisible: one policy update through Apply until a snapshot holds
// it (WaitFor its revision), on a store of 10k policies; reports p50 and p99
// of the whole (put→visible) and of the Apply alone. Target: p99 ≤ 10 ms.
func BenchmarkPutVisible(b *testing.B) {
	for _, c := range []struct {
		name             string
		noFsync, private bool
	}{
		{"fsync=on", false, false},
		{"fsync=off", true, false},
		// verdictd's embedded etcd: TLS with client certificates (Private).
		{"fsync=on,private", false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var st *etcd.Store
			if c.private {
				e, err := embedetcd.Start(context.Background(), embedetcd.Config{Dir: b.TempDir(), Private: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close() })
				if st, err = etcd.New(context.Background(), etcd.Config{Endpoints: e.Endpoints(), TLS: e.ClientTLS()}); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { st.Close() })
			} else {
				st = benchStore(b, benchEtcd(b, c.noFsync))
			}
			set := policygen.Generate(policygen.Config{Seed: 2, Policies: 10_000})
			load(b, st, set.Resources)
			sy, stop := benchSyncer(b, st)
			defer stop()
			pols := set.Policies()
			var total, apply []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p := *pols[i%len(pols)]
				p.Priority = int32(i)
				start := time.Now()
				rev, err := st.Apply(context.Background(), []store.Op{{Resource: &p}})
				if err != nil {
					b.Fatal(err)
				}
				applied := time.Now()
				waitRev(b, sy, rev)
				apply = append(apply, applied.Sub(start))
				total = append(total, time.Since(start))
			}
			b.ReportMetric(pct(total, 50), "p50-ms")
			b.ReportMetric(pct(total, 99), "p99-ms")
			b.ReportMetric(pct(apply, 50), "apply-p50-ms")
			b.ReportMetric(pct(apply, 99), "apply-p99-ms")
		})
	}
}

func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return float64(s[max(i, 0)].Microseconds()) / 1000
}

// BenchmarkBulkApply10k: 10k new policies written as verdictctl apply sends
// them (transactions of 128, one after the other) into a store of 10k, until a
// snapshot holds them all. Reports the time from the last write to the
// snapshot (catch-up) and the snapshots built. Target: caught up ≤ 2 s.
func BenchmarkBulkApply10k(b *testing.B) {
	e := benchEtcd(b, false)
	st := benchStore(b, e)
	load(b, st, policygen.Generate(policygen.Config{Seed: 3, Policies: 10_000, Mesh: "base"}).Resources)
	sy, stop := benchSyncer(b, st)
	defer stop()
	var catchup time.Duration
	var built int64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		rs := policygen.Generate(policygen.Config{Seed: uint64(10 + i), Policies: 10_000, Mesh: fmt.Sprintf("bulk-%d", i)}).Resources
		before := sy.Snapshots()
		b.StartTimer()
		rev := load(b, st, rs)
		written := time.Now()
		snap := waitRev(b, sy, rev)
		catchup += time.Since(written)
		built += sy.Snapshots() - before
		if _, ok := snap.Get(rs[len(rs)-1].Key()); !ok {
			b.Fatal("the last policy is not in the snapshot")
		}
	}
	b.ReportMetric(float64(catchup.Microseconds())/1000/float64(b.N), "catchup-ms")
	b.ReportMetric(float64(built)/float64(b.N), "snapshots")
}

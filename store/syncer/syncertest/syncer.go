// Package syncertest runs a syncer over any store.Store in tests.
package syncertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/storetest"
	"github.com/verdictpdp/verdict/store/syncer"
)

// StartSyncer runs a syncer on st until the test ends and waits until it has
// synced.
func StartSyncer(t testing.TB, st store.Store, cfg syncer.Config) *syncer.Syncer {
	t.Helper()
	cfg.Store = st
	sy, err := syncer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sy.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	storetest.Eventually(t, "the syncer to sync", sy.Synced)
	return sy
}

// WaitFor waits for the syncer to reach rev.
func WaitFor(t testing.TB, sy *syncer.Syncer, rev int64) *engine.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := sy.WaitFor(ctx, rev)
	if err != nil {
		t.Fatalf("WaitFor(%d): %v (at %d)", rev, err, sy.Snapshot().Revision())
	}
	return snap
}

// Run runs the syncer's part of the store contract: a syncer over each
// harness's store turns its writes into snapshots and change sets.
func Run(t *testing.T, newHarness storetest.Factory) {
	t.Run("writes are visible in the next snapshot, and delivered to subscribers", func(t *testing.T) {
		st := newHarness(t).Store
		sy := StartSyncer(t, st, syncer.Config{})
		sub := sy.Subscribe(16)
		defer sub.Close()
		p := storetest.Policy(t, "default", "a", 1)

		rev := storetest.Apply(t, st, storetest.Put(p))
		e, ok := WaitFor(t, sy, rev).Get(p.Key())
		if !ok || e.Err != nil || e.Resource.Metadata().ModRevision != rev {
			t.Fatalf("after create: %+v, %v", e, ok)
		}
		rev = storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 2)))
		if e, _ := WaitFor(t, sy, rev).Get(p.Key()); e.Resource.(*resource.Policy).Priority != 2 {
			t.Fatal("update not visible")
		}
		rev = storetest.Apply(t, st, store.Op{Key: p.Key()})
		if _, ok := WaitFor(t, sy, rev).Get(p.Key()); ok {
			t.Fatal("delete not visible")
		}
		seen := 0
		for seen < 3 {
			select {
			case u := <-sub.Updates():
				if u.Previous.Revision() > u.Snapshot.Revision() {
					t.Fatalf("update from %d to %d", u.Previous.Revision(), u.Snapshot.Revision())
				}
				seen += len(u.Changes)
			case <-time.After(30 * time.Second):
				t.Fatalf("subscriber saw %d of 3 changes", seen)
			}
		}
		if st := sy.Status(); !st.Synced || st.Stale || st.Revision < rev {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("a bulk write builds few snapshots", func(t *testing.T) {
		st := newHarness(t).Store
		sy := StartSyncer(t, st, syncer.Config{})
		before := sy.Snapshots()
		n := 10000
		if testing.Short() {
			n = 2000
		}
		rev := storetest.ApplyMany(t, st, storetest.Policies(t, "default", "bulk", n))
		snap := WaitFor(t, sy, rev)
		if snap.Len() != n {
			t.Fatalf("snapshot holds %d resources, want %d", snap.Len(), n)
		}
		txns := int64((n + store.MaxOps - 1) / store.MaxOps)
		if built := sy.Snapshots() - before; built > txns {
			t.Fatalf("%d snapshots for %d transactions", built, txns)
		}
		if snap.Digest() != storetest.Digest(t, st) {
			t.Fatal("snapshot differs from the store")
		}
	})

	t.Run("an interruption with a compaction: stale meanwhile, then equal to the store", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		storetest.ApplyMany(t, st, storetest.Policies(t, "default", "p", 200))
		sy := StartSyncer(t, st, syncer.Config{StaleAfter: 2 * time.Second})
		served := sy.Snapshot()

		resume := h.Interrupt()
		storetest.Eventually(t, "the syncer to report itself stale", sy.Stale)
		if sy.Snapshot() != served && sy.Snapshot().Revision() < served.Revision() {
			t.Fatal("the served snapshot went back")
		}
		storetest.ApplyMany(t, h.Writer, storetest.Policies(t, "default", "more", 200))
		for i := range 20 {
			storetest.Apply(t, h.Writer, store.Op{Key: storetest.Policy(t, "default", pname(i), 0).Key()})
		}
		last := storetest.Apply(t, h.Writer, storetest.Put(storetest.Policy(t, "other", "o", 0)))
		if err := h.Compact(storetest.Context(t), last); err != nil {
			t.Fatal(err)
		}
		resume()
		snap := WaitFor(t, sy, last)
		if snap.Digest() != storetest.Digest(t, st) {
			t.Fatal("after the interruption the snapshot differs from the store")
		}
		storetest.Eventually(t, "the syncer to be current again", func() bool { return !sy.Stale() })
	})

	t.Run("broken values are skipped and listed; other resources and meshes unaffected", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		good := storetest.Policy(t, "default", "good", 0)
		other := storetest.Policy(t, "other", "fine", 0)
		storetest.Apply(t, st, storetest.Put(good), storetest.Put(other))
		sy := StartSyncer(t, st, syncer.Config{})
		storetest.WriteBroken(t, h)
		// A valid value written by hand, not in canonical form: the digest
		// hashes the stored bytes.
		last, err := h.RawPut(storetest.Context(t), "other/policies/TrafficPermission/by-hand",
			[]byte(`{ "name": "by-hand", "kind": "Policy", "mesh": "other", "sources": [{}], "destinations": [{}] }`))
		if err != nil {
			t.Fatal(err)
		}
		snap := WaitFor(t, sy, last)
		if len(snap.Invalid()) != storetest.BrokenCount() || sy.Status().Invalid != storetest.BrokenCount() {
			t.Fatalf("%d invalid resources listed, want %d: %+v", len(snap.Invalid()), storetest.BrokenCount(), snap.Invalid())
		}
		for _, inv := range snap.Invalid() {
			if inv.Err == nil || inv.Value == nil {
				t.Fatalf("invalid %s lacks its error or value", inv.Path)
			}
		}
		for _, r := range []resource.Resource{good, other} {
			if e, ok := snap.Get(r.Key()); !ok || e.Err != nil {
				t.Fatalf("%s affected by broken values: %+v", r.Key(), e)
			}
		}
		req := &engine.Request{Mesh: "other", Source: resource.Tags{"kuma.io/service": "web"}, Destination: resource.Tags{"kuma.io/service": "fine"}}
		if d, err := snap.Decide(req); err != nil || d.Action != resource.Allow {
			t.Fatalf("decide in mesh other: %+v, %v", d, err)
		}
		if snap.Digest() != storetest.Digest(t, st) {
			t.Fatal("snapshot differs from the store")
		}
	})

	t.Run("WaitFor ends with its context", func(t *testing.T) {
		st := newHarness(t).Store
		sy := StartSyncer(t, st, syncer.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := sy.WaitFor(ctx, sy.Snapshot().Revision()+1000); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitFor beyond the store: %v", err)
		}
	})
}

func pname(i int) string { return "p-" + pad6(i) }

func pad6(i int) string {
	s := []byte("000000")
	for j := 5; j >= 0 && i > 0; j-- {
		s[j] = byte('0' + i%10)
		i /= 10
	}
	return string(s)
}

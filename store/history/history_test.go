package history_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/history"
	"github.com/verdictpdp/verdict/store/storetest"
)

func TestMain(m *testing.M) {
	var opts []goleak.Option
	for _, f := range embedetcd.Lingering() {
		opts = append(opts, goleak.IgnoreAnyFunction(f))
	}
	goleak.VerifyTestMain(m, opts...)
}

func newStore(t testing.TB) *etcd.Store { return newStoreAt(t, nil) }

// newStoreAt is newStore stamping its writes with now (nil: the clock).
func newStoreAt(t testing.TB, now func() time.Time) *etcd.Store {
	t.Helper()
	ctx := storetest.Context(t)
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// state reads the store's current state through its plain List (not the
// history code): the oracle of the differential test.
func state(t testing.TB, st store.Store, rev int64) *engine.Snapshot {
	t.Helper()
	var changes []engine.Change
	opts := store.ListOptions{Revision: rev}
	for {
		page, err := st.List(storetest.Context(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			changes = append(changes, it.Change())
		}
		if page.NextPageToken == "" {
			return engine.Empty().Apply(rev, changes)
		}
		opts.PageToken = page.NextPageToken
	}
}

var (
	apps = []string{"web", "api", "db", "cache"}
	envs = []string{"prod", "dev"}
)

// flows are every pair of apps in every pair of environments.
func flows() []engine.Request {
	var out []engine.Request
	for _, a := range apps {
		for _, b := range apps {
			for _, ea := range envs {
				for _, eb := range envs {
					out = append(out, engine.Request{Source: resource.Tags{"app": a, "env": ea}, Destination: resource.Tags{"app": b, "env": eb}})
				}
			}
		}
	}
	return out
}

// decisions are snap's answers (error text included) to every flow.
func decisions(snap *engine.Snapshot) []string {
	var out []string
	for _, f := range flows() {
		d, err := snap.Decide(&f)
		if err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("%v %s %v/%s/%s %v/%s/%s", d.Action, d.Policy, d.Outbound.Action, d.Outbound.Policy, d.Outbound.Rule,
			d.Inbound.Action, d.Inbound.Policy, d.Inbound.Rule))
	}
	return out
}

// TestPastSnapshotsEqualFreshOnes is the differential test: over random
// write histories (puts, deletes, scope and mesh changes, writes refused
// by the store's checks), the snapshot at every past revision — asked in a
// random order, so that it is built from later and earlier snapshots, from a
// small cache that evicts, and sometimes from a full read — decides every flow
// as a fresh engine built from the store's documents at that revision, and
// holds the same contents (equal digests).
func TestPastSnapshotsEqualFreshOnes(t *testing.T) {
	st := newStore(t)
	ctx := storetest.Context(t)
	for seed := range uint64(2) {
		r := rand.New(rand.NewPCG(seed, 42))
		var revs []int64
		want := map[int64]*engine.Snapshot{}
		for range 40 {
			rev, err := st.Apply(ctx, storetest.RandomWrite(t, r, storetest.World{}))
			if err != nil {
				continue // refused (a scope in use, a missing scope): nothing written
			}
			revs = append(revs, rev)
			want[rev] = state(t, st, rev)
		}
		current := want[revs[len(revs)-1]]
		snaps, err := history.New(history.Config{Store: st, Current: func() *engine.Snapshot { return current },
			MaxSnapshots: 8, MaxDelta: 1 + int(seed)*40})
		if err != nil {
			t.Fatal(err)
		}
		order := slices.Clone(revs)
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, rev := range append(order, order[len(order)-4:]...) { // the last four again: cached
			got, err := snaps.At(ctx, rev)
			if err != nil {
				t.Fatalf("seed %d: revision %d: %v", seed, rev, err)
			}
			if got.Revision() != rev || got.Digest() != want[rev].Digest() {
				t.Fatalf("seed %d: revision %d: snapshot at %d, digest %s, want %s", seed, rev, got.Revision(), got.Digest(), want[rev].Digest())
			}
			if g, w := decisions(got), decisions(want[rev]); !reflect.DeepEqual(g, w) {
				for i := range g {
					if g[i] != w[i] {
						t.Fatalf("seed %d: revision %d: flow %v: %s, a fresh engine says %s", seed, rev, flows()[i], g[i], w[i])
					}
				}
			}
		}
		s := snaps.Stats()
		if s.Deltas == 0 || s.Hits == 0 || s.Entries > 8 {
			t.Errorf("seed %d: %+v: want snapshots built from others, cache hits, at most 8 kept", seed, s)
		}
		if seed == 0 && s.Fulls == 0 {
			t.Errorf("seed 0 (deltas of at most one change): %+v: want full reads too", s)
		}
	}
}

// TestRetentionEdge: below the oldest revision held the answer is a
// CompactedError naming it; above the current one, ErrFutureRevision.
func TestRetentionEdge(t *testing.T) {
	st := newStore(t)
	ctx := storetest.Context(t)
	var revs []int64
	for i := range 5 {
		revs = append(revs, storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "p", i))))
	}
	current := state(t, st, revs[4])
	var known atomic.Int64 // what the replica's maintenance knows of the compaction
	snaps, err := history.New(history.Config{Store: st, Current: func() *engine.Snapshot { return current }, Oldest: known.Load})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.At(ctx, revs[1]); err != nil { // cached before the compaction
		t.Fatal(err)
	}
	if _, err := st.Client().Compact(ctx, revs[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.At(ctx, revs[1]); err != nil {
		t.Errorf("a cached snapshot before the replica knows of the compaction: %v", err)
	}
	known.Store(revs[3])
	if _, err := snaps.At(ctx, revs[1]); !errors.Is(err, store.ErrCompacted) {
		t.Errorf("a cached snapshot below the oldest revision known: %v", err)
	}
	cases := []struct {
		rev  int64
		want error
	}{
		{revs[3] - 1, store.ErrCompacted},
		{revs[3], nil},
		{revs[4] + 100, store.ErrFutureRevision},
	}
	for _, tc := range cases {
		_, err := snaps.At(ctx, tc.rev)
		if !errors.Is(err, tc.want) && (err != nil || tc.want != nil) {
			t.Errorf("revision %d: %v, want %v", tc.rev, err, tc.want)
		}
		var ce *store.CompactedError
		if errors.Is(tc.want, store.ErrCompacted) && (!errors.As(err, &ce) || ce.Oldest != revs[3]) {
			t.Errorf("revision %d: %v does not name the oldest revision %d", tc.rev, err, revs[3])
		}
	}
	if _, err := snaps.AtTime(ctx, time.Now().Add(time.Hour)); !errors.Is(err, store.ErrFutureRevision) {
		t.Errorf("a time after now: %v", err)
	}
}

// TestCacheBounds: the cache keeps at most MaxSnapshots snapshots and stays
// within MaxBytes (but for the newest one), dropping the least recently used
// first: a snapshot asked again outlives one asked only before it.
func TestCacheBounds(t *testing.T) {
	st := newStore(t)
	ctx := storetest.Context(t)
	var revs []int64
	for i := range 5 {
		revs = append(revs, storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", fmt.Sprint("p", i), i))))
	}
	current := state(t, st, revs[4])
	cases := []struct {
		name      string
		cfg       history.Config
		asks      []int64 // in order
		cached    []int64 // then found in the cache
		notCached []int64
		entries   int // cached (0: as many as cached lists)
	}{
		{"count, least recently used first", history.Config{MaxSnapshots: 2},
			[]int64{revs[0], revs[1], revs[0], revs[2]}, []int64{revs[0], revs[2]}, []int64{revs[1]}, 0},
		{"count, in the order asked", history.Config{MaxSnapshots: 2},
			[]int64{revs[0], revs[1], revs[2]}, []int64{revs[1], revs[2]}, []int64{revs[0]}, 0},
		{"bytes: the newest one alone", history.Config{MaxBytes: 1},
			[]int64{revs[0], revs[1], revs[2]}, []int64{revs[2]}, []int64{revs[0], revs[1]}, 0},
		{"count: the newest stays when others were asked as lately", history.Config{MaxSnapshots: 2},
			[]int64{revs[0], revs[1], revs[0], revs[1], revs[2]}, []int64{revs[2]}, nil, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Store, cfg.Current = st, func() *engine.Snapshot { return current }
			snaps, err := history.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, rev := range tc.asks {
				if _, err := snaps.At(ctx, rev); err != nil {
					t.Fatal(err)
				}
			}
			want := tc.entries
			if want == 0 {
				want = len(tc.cached)
			}
			if s := snaps.Stats(); s.Entries != want {
				t.Errorf("%d entries cached, want %d", s.Entries, want)
			}
			for _, rev := range tc.cached {
				before := snaps.Stats().Misses
				if _, err := snaps.At(ctx, rev); err != nil {
					t.Fatal(err)
				}
				if snaps.Stats().Misses != before {
					t.Errorf("revision %d is not cached", rev)
				}
			}
			for _, rev := range tc.notCached {
				before := snaps.Stats().Misses
				if _, err := snaps.At(ctx, rev); err != nil {
					t.Fatal(err)
				}
				if snaps.Stats().Misses == before {
					t.Errorf("revision %d is cached", rev)
				}
			}
		})
	}
}

// TestRevertRestoresDocumentsExactly: a revert to an earlier revision writes
// back every document as it was — creationTime included, for a key deleted
// and created again since — and deletes what was created since; its plan is
// refused when a key changed after the revision the caller saw.
func TestRevertRestoresDocumentsExactly(t *testing.T) {
	var clock atomic.Int64 // every write an hour after the one before
	st := newStoreAt(t, func() time.Time {
		return time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC).Add(time.Duration(clock.Add(1)) * time.Hour)
	})
	ctx := storetest.Context(t)
	p, q := storetest.Policy(t, "default", "p", 0), storetest.Policy(t, "default", "q", 0)
	storetest.Apply(t, st, storetest.Put(p), storetest.Put(q))
	target := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "p", 1)))
	storetest.Apply(t, st, store.Op{Key: p.Key()})
	storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "p", 7)), storetest.Put(storetest.Policy(t, "default", "r", 0)))
	seen := storetest.Apply(t, st, store.Op{Key: q.Key()})

	plan, err := history.PlanRevert(ctx, st, "default/", true, target, seen)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := st.Apply(store.WithVia(ctx, "revert"), plan.Ops)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := history.Diff(ctx, st, "default/", target, rev, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 0 {
		t.Errorf("after the revert, %d keys differ from revision %d: %+v", len(diffs), target, diffs)
	}
	was, now := state(t, st, target), state(t, st, rev)
	was.Resources(func(e engine.Entry) bool {
		got, ok := now.Get(e.Resource.Key())
		if !ok {
			t.Errorf("%s not restored", e.Resource.Key())
			return true
		}
		wm, gm := e.Resource.Metadata(), got.Resource.Metadata()
		if !wm.CreationTime.Equal(gm.CreationTime) || !gm.ModificationTime.After(wm.ModificationTime) {
			t.Errorf("%s: times %v/%v, want creationTime %v and a later modificationTime", e.Resource.Key(), gm.CreationTime, gm.ModificationTime, wm.CreationTime)
		}
		return true
	})
	if now.Len() != was.Len() {
		t.Errorf("%d resources after the revert, %d at revision %d", now.Len(), was.Len(), target)
	}
	if _, err := history.PlanRevert(ctx, st, "default/", true, target, seen); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a plan from a revision before the last change: %v, want a conflict", err)
	}

	page, err := history.Versions(ctx, st, history.Query{Key: p.Key().String(), PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	var all []history.Entry
	for {
		all = append(all, page.Entries...)
		if page.NextPageToken == "" {
			break
		}
		if page, err = history.Versions(ctx, st, history.Query{Key: p.Key().String(), PageSize: 2, PageToken: page.NextPageToken}); err != nil {
			t.Fatal(err)
		}
	}
	if len(all) != 5 || !all[2].Deleted || all[4].Record == nil || all[4].Record.Via != "revert" || all[4].Revision != rev {
		t.Errorf("the versions of p: %+v", all)
	}
}

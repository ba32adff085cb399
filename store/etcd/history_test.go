package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/storetest"
)

// clock is a settable clock for Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func clockedStore(t *testing.T, endpoints []string, c *clock) *etcd.Store {
	t.Helper()
	st, err := etcd.New(storetest.Context(t), etcd.Config{Endpoints: endpoints, Now: c.now, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestWriteRecords: every write records its time and writer in its own
// transaction; a replica whose clock is behind the last record records that
// record's time, never an earlier one, and stamps its puts with it.
func TestWriteRecords(t *testing.T) {
	e := startEtcd(t)
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	ca, cb := &clock{t: base}, &clock{t: base.Add(-time.Hour)}
	a, b := clockedStore(t, e.Endpoints(), ca), clockedStore(t, e.Endpoints(), cb)
	ctx := storetest.Context(t)

	type write struct {
		st     *etcd.Store
		writer string
		want   time.Time // the recorded time
	}
	writes := []write{
		{a, "spiffe://ops/alice", base},
		{b, "token", base}, // b's clock is an hour behind: a's record's time
		{a, "anonymous 127.0.0.1:5000", base},
	}
	var revs []int64
	for i, w := range writes {
		p := storetest.Policy(t, "default", "p", i)
		rev, err := w.st.Apply(store.WithWriter(ctx, w.writer), []store.Op{storetest.Put(p)})
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		revs = append(revs, rev)
	}
	ca.set(base.Add(time.Minute))
	rev, err := a.Apply(store.WithVia(store.WithWriter(ctx, "token"), "revert"), []store.Op{storetest.Put(storetest.Policy(t, "default", "p", 9))})
	if err != nil {
		t.Fatal(err)
	}
	revs = append(revs, rev)
	writes = append(writes, write{a, "token", base.Add(time.Minute)})

	recs, err := a.Records(ctx, append(revs, revs[0]-1))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(revs) {
		t.Errorf("%d records for %d writes (a revision without a write has none): %v", len(recs), len(revs), recs)
	}
	for i, r := range revs {
		rec := recs[r]
		if rec.Writer != writes[i].writer || !rec.Time.Equal(writes[i].want) || rec.Revision != r {
			t.Errorf("write %d at %d: record %+v, want writer %q at %v", i, r, rec, writes[i].writer, writes[i].want)
		}
	}
	if recs[revs[3]].Via != "revert" {
		t.Errorf("the revert's record says via %q", recs[revs[3]].Via)
	}
	it, err := b.Get(ctx, storetest.Policy(t, "default", "p", 0).Key())
	if err != nil {
		t.Fatal(err)
	}
	if mt := it.Resource.Metadata().ModificationTime; !mt.Equal(base.Add(time.Minute)) {
		t.Errorf("modificationTime %v, want the last write's recorded time", mt)
	}
}

// TestVersions: the changes of a key and of a prefix within a window, with
// deletions and what each change replaced; pages by limit.
func TestVersions(t *testing.T) {
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	ctx := storetest.Context(t)
	p0, p1, q := storetest.Policy(t, "default", "p", 0), storetest.Policy(t, "default", "p", 1), storetest.Policy(t, "default", "q", 0)
	start := storetest.Apply(t, st, storetest.Put(q))
	r1 := storetest.Apply(t, st, storetest.Put(p0))
	r2 := storetest.Apply(t, st, storetest.Put(p1))
	r3 := storetest.Apply(t, st, store.Op{Key: p0.Key()})
	r4 := storetest.Apply(t, st, storetest.Put(p0), store.Op{Key: q.Key()})

	vs, more, err := st.Versions(ctx, p0.Key().String(), false, start, r4, 0)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		rev     int64
		deleted bool
		prev    bool
	}
	want := []got{{r1, false, false}, {r2, false, true}, {r3, true, true}, {r4, false, false}}
	if more || len(vs) != len(want) {
		t.Fatalf("%d versions (more %v), want %d: %+v", len(vs), more, len(want), vs)
	}
	for i, v := range vs {
		if g := (got{v.Revision, v.Deleted, v.Prev != nil}); g != want[i] {
			t.Errorf("version %d: %+v, want %+v", i, g, want[i])
		}
	}
	if vs[1].Prev.ModRevision != r1 || vs[1].Item.Resource == nil {
		t.Errorf("the update replaced %+v", vs[1].Prev)
	}

	all, more, err := st.Versions(ctx, "default/", true, 0, r4, 0)
	if err != nil || more {
		t.Fatal(err, more)
	}
	if len(all) != 6 || all[0].Revision != start || all[5].Path != q.Key().String() || !all[5].Deleted {
		t.Errorf("the prefix's versions: %+v", all)
	}
	page, more, err := st.Versions(ctx, "default/", true, start, r4, 2)
	if err != nil || !more || len(page) != 2 || page[0].Revision != r1 {
		t.Errorf("a page of 2: %+v, more %v, %v", page, more, err)
	}
	if _, _, err := st.Versions(ctx, "default/", true, start, r4+1000, 0); !errors.Is(err, store.ErrFutureRevision) {
		t.Errorf("a window ending in the future: %v", err)
	}
}

// TestRevisionAt: at_time's revision exactly at a write's time, between
// writes, before the first, and after the last.
func TestRevisionAt(t *testing.T) {
	e := startEtcd(t)
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	c := &clock{t: base}
	st := clockedStore(t, e.Endpoints(), c)
	ctx := storetest.Context(t)
	var revs []int64
	for i := range 5 {
		c.set(base.Add(time.Duration(i) * time.Minute))
		revs = append(revs, storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "p", i))))
	}
	cases := []struct {
		name string
		at   time.Time
		want int64
	}{
		{"exactly at the first write", base, revs[0]},
		{"exactly at a write", base.Add(2 * time.Minute), revs[2]},
		{"between writes", base.Add(2*time.Minute + 30*time.Second), revs[2]},
		{"a nanosecond before a write", base.Add(3*time.Minute - 1), revs[2]},
		{"after the last write", base.Add(time.Hour), revs[4]},
		{"before the first write: the empty store", base.Add(-time.Second), 1},
	}
	for _, tc := range cases {
		got, err := st.RevisionAt(ctx, tc.at)
		if err != nil || got != tc.want {
			t.Errorf("%s: revision %d (%v), want %d", tc.name, got, err, tc.want)
		}
	}

	// Compacted past the first writes: a time before the oldest revision
	// held names it.
	if _, err := st.Client().Compact(ctx, revs[2]); err != nil {
		t.Fatal(err)
	}
	_, err := st.RevisionAt(ctx, base.Add(30*time.Second))
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Oldest != revs[2] {
		t.Errorf("a time before the oldest revision: %v, want a CompactedError naming %d", err, revs[2])
	}
	if got, err := st.RevisionAt(ctx, base.Add(3*time.Minute)); err != nil || got != revs[3] {
		t.Errorf("after compaction, at a write: %d, %v", got, err)
	}
	if _, err := st.StateAt(ctx, revs[1], ""); !errors.As(err, &ce) || ce.Oldest != revs[2] || !errors.Is(err, store.ErrCompacted) {
		t.Errorf("a state below the oldest revision: %v", err)
	}
	if _, err := st.Oldest(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestManyWritersOfOneReplicaAllGetThrough: writers of one replica race on
// the write record (each write's recorded time must not go backwards), and
// a transaction that lost that race alone is sent again at once: none of
// many concurrent puts of distinct keys fails.
func TestManyWritersOfOneReplicaAllGetThrough(t *testing.T) {
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	ctx := storetest.Context(t)
	const writers, puts = 48, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*puts)
	for w := range writers {
		wg.Go(func() {
			for i := range puts {
				p := storetest.Policy(t, "default", fmt.Sprintf("w%d", w), i%5)
				if _, err := st.Apply(ctx, []store.Op{storetest.Put(p)}); err != nil {
					errs <- fmt.Errorf("writer %d, put %d: %w", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 3 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d puts failed", n, writers*puts)
	}
}

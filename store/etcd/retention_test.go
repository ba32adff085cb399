package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/storetest"
)

// maintain runs st.Maintain(r) until the test ends.
func maintain(t *testing.T, st *etcd.Store, r etcd.Retention) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := st.Maintain(ctx, r); err != nil {
			t.Errorf("Maintain: %v", err)
		}
	})
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// rounds waits until st has run n more maintenance rounds.
func rounds(t *testing.T, st *etcd.Store, n int64) {
	t.Helper()
	from := st.Storage().Checks
	storetest.Eventually(t, fmt.Sprintf("%d maintenance rounds", n), func() bool { return st.Storage().Checks >= from+n })
}

// readableAt reports whether etcd still holds revision rev.
func readableAt(t *testing.T, cli *clientv3.Client, rev int64) bool {
	t.Helper()
	_, err := cli.Get(storetest.Context(t), "x", clientv3.WithRev(rev))
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatal(err)
	}
	return err == nil
}

// TestRetentionByRevisions: with many writes the revision count wins: etcd
// is compacted to about the current revision less Revisions, while a
// watching syncer-like follower goes on, its digest the store's (the watch
// survives the store's own compaction).
func TestRetentionByRevisions(t *testing.T) {
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	f := storetest.Follow(t, st, 0)
	maintain(t, st, etcd.Retention{Revisions: 20, Interval: 20 * time.Millisecond, ElectionTTL: time.Second, Defrag: true, DefragMinFree: 1})
	storetest.Eventually(t, "the compactor elected", func() bool { return st.Storage().Compactor })
	first := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "p-0", 0)))
	var last int64
	for i := range 200 {
		last = storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", fmt.Sprintf("p-%d", i%10), i)))
	}
	storetest.Eventually(t, "a compaction past the first writes", func() bool { return st.Storage().OldestRevision > first+50 })
	if readableAt(t, st.Client(), first) {
		t.Fatalf("revision %d still readable after a compaction to %d", first, st.Storage().OldestRevision)
	}
	// The compactor's own bookkeeping writes move the revision past last:
	// what must stay readable is the last 20 of the revision now (a
	// compaction never reaches past its own current revision less 20).
	resp, err := st.Client().Get(storetest.Context(t), "x")
	if err != nil {
		t.Fatal(err)
	}
	if now := resp.Header.Revision; !readableAt(t, st.Client(), now-20) {
		t.Fatalf("revision %d (within the last 20 of %d) compacted; compacted to %d", now-20, now, st.Storage().OldestRevision)
	}
	f.WaitRevision(t, last)
	if got, want := f.Snapshot().Digest(), storetest.Digest(t, st); got != want {
		t.Fatalf("the follower's digest %s, the store's %s", got, want)
	}
	s := st.Storage()
	if s.Compactions == 0 || s.Defrags == 0 || s.DBSize == 0 || len(s.Alarms) != 0 {
		t.Fatalf("storage %+v: want compactions, defragmentations, a size and no alarm", s)
	}
	// The bookkeeping is under its own prefix: nothing of it is listed.
	items, _ := storetest.ListAll(t, st, "")
	for _, it := range items {
		if it.Err != nil {
			t.Fatalf("listed %s: %v", it.Path, it.Err)
		}
	}
}

// TestRetentionByTime: with few writes the time bound wins: nothing is
// compacted while no revision-time sample is Duration old; then etcd is
// compacted to the newest such sample's revision, never past what was
// written within Duration.
func TestRetentionByTime(t *testing.T) {
	e := startEtcd(t)
	st := newStore(t, e.Endpoints())
	var mu sync.Mutex
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	maintain(t, st, etcd.Retention{Duration: time.Hour, Revisions: 1 << 40, CompactStep: 1, Interval: 20 * time.Millisecond,
		SampleInterval: time.Minute, ElectionTTL: time.Second, Now: clock})
	storetest.Eventually(t, "the compactor elected", func() bool { return st.Storage().Compactor })
	early := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 0)))
	rounds(t, st, 3) // the first sample, at 00:00
	mid := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 1)))
	advance(30 * time.Minute)
	rounds(t, st, 3) // a sample at 00:30, at or after mid
	if !readableAt(t, st.Client(), early) || st.Storage().Compactions != 0 {
		t.Fatalf("compacted within the hour: %+v", st.Storage())
	}
	advance(45 * time.Minute) // 01:15: the first sample is over an hour old, the second not
	storetest.Eventually(t, "a compaction by time", func() bool { return st.Storage().Compactions > 0 })
	rounds(t, st, 3)
	if s := st.Storage(); s.OldestRevision >= mid || !readableAt(t, st.Client(), mid) {
		t.Fatalf("compacted to %d: past revision %d, written 45 minutes ago", s.OldestRevision, mid)
	}
	advance(30 * time.Minute) // 01:45: the 00:30 sample is over an hour old
	storetest.Eventually(t, "a compaction to the second sample", func() bool { return st.Storage().OldestRevision >= mid })
}

// TestRetentionOneCompactor: of two replicas exactly one compacts; when it
// stops, the other takes over.
func TestRetentionOneCompactor(t *testing.T) {
	e := startEtcd(t)
	a, b := newStore(t, e.Endpoints()), newStore(t, e.Endpoints())
	r := etcd.Retention{Revisions: 10, Interval: 20 * time.Millisecond, ElectionTTL: time.Second}
	stopA := maintain(t, a, r)
	storetest.Eventually(t, "a elected", func() bool { return a.Storage().Compactor })
	maintain(t, b, r)
	rounds(t, b, 5)
	if b.Storage().Compactor || !a.Storage().Compactor {
		t.Fatalf("compactors: a %v, b %v; want a alone", a.Storage().Compactor, b.Storage().Compactor)
	}
	stopA()
	storetest.Eventually(t, "b elected once a stopped", func() bool { return b.Storage().Compactor })
	var last int64
	for i := range 40 {
		last = storetest.Apply(t, b, storetest.Put(storetest.Policy(t, "default", "p", i)))
	}
	storetest.Eventually(t, "b compacts", func() bool { return b.Storage().OldestRevision >= last-20 })
	if a.Storage().Compactions != 0 {
		t.Fatalf("a compacted %d times after it stopped", a.Storage().Compactions)
	}
}

// TestRetentionNoSpace: a NOSPACE alarm shows in every replica's Storage
// (and its log); the compactor compacts, defragments and disarms it, and
// writes go through again.
func TestRetentionNoSpace(t *testing.T) {
	e := startEtcd(t)
	observer, compactor := newStore(t, e.Endpoints()), newStore(t, e.Endpoints())
	maintain(t, observer, etcd.Retention{Off: true, Interval: 20 * time.Millisecond})
	storetest.Apply(t, observer, storetest.Put(storetest.Policy(t, "default", "a", 0)))
	ctx := storetest.Context(t)
	st, err := observer.Client().Status(ctx, e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewMaintenanceClient(observer.Client().ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, "the alarm in Storage", func() bool {
		al := observer.Storage().Alarms
		return len(al) == 1 && strings.HasPrefix(al[0], "NOSPACE")
	})
	if _, err := observer.Apply(ctx, []store.Op{storetest.Put(storetest.Policy(t, "default", "b", 0))}); err == nil {
		t.Fatal("a write went through under NOSPACE")
	}
	maintain(t, compactor, etcd.Retention{Revisions: 1, Interval: 20 * time.Millisecond, ElectionTTL: time.Second, Defrag: true})
	storetest.Eventually(t, "the alarm disarmed", func() bool { return len(observer.Storage().Alarms) == 0 })
	if compactor.Storage().Defrags == 0 {
		t.Fatal("disarmed without a defragmentation")
	}
	storetest.Apply(t, observer, storetest.Put(storetest.Policy(t, "default", "b", 0)))
}

func TestRetentionValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r  etcd.Retention
		ok bool
	}{
		{etcd.Retention{}, true},
		{etcd.Retention{Off: true}, true},
		{etcd.Retention{Duration: -time.Second}, false},
		{etcd.Retention{Revisions: -1}, false},
		{etcd.Retention{ElectionTTL: 100 * time.Millisecond}, false},
	} {
		if err := tc.r.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.r, err)
		}
	}
}

package syncer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/storetest"
	"github.com/verdictpdp/verdict/store/syncer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted is a store.Store whose watch plays the events a test queues: the
// syncer's handling of events, in isolation. (The syncer on real stores,
// etcd included, is in the storetest suite.)
type scripted struct {
	store.Store // unused methods panic
	mu          sync.Mutex
	events      chan store.Event
	watches     []int64 // fromRevision of each Watch
	connected   bool
}

func newScripted(buffer int) *scripted {
	return &scripted{events: make(chan store.Event, buffer), connected: true}
}

func (s *scripted) Watch(ctx context.Context, from int64) <-chan store.Event {
	s.mu.Lock()
	s.watches = append(s.watches, from)
	s.mu.Unlock()
	// Events queued now are queued on the watch's channel at once, as a store
	// with a backlog would present them — as many as it holds: a test sending
	// meanwhile must not block Watch itself (the syncer reads the channel only
	// once Watch has returned).
	out := make(chan store.Event, cap(s.events)+1)
	for queued := true; queued && len(out) < cap(out); {
		select {
		case ev := <-s.events:
			out <- ev
		default:
			queued = false
		}
	}
	go func() {
		defer close(out)
		for {
			select {
			case ev := <-s.events:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (s *scripted) Health() store.Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	return store.Health{Connected: s.connected}
}

func (s *scripted) Watches() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.watches...)
}

func put(t testing.TB, name string, mod int64) engine.Change {
	r := storetest.Policy(t, "default", name, 0)
	r = r.WithMeta(resource.Meta{CreateRevision: mod, ModRevision: mod})
	c := engine.Put(r)
	c.ModRevision = mod
	c.Value = []byte(fmt.Sprintf("%s@%d", name, mod))
	return c
}

func del(name string, rev int64) engine.Change {
	return store.DeleteChange("default/policies/TrafficPermission/"+name, rev)
}

func run(t *testing.T, cfg syncer.Config) *syncer.Syncer {
	t.Helper()
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
			t.Error(err)
		}
	})
	return sy
}

func waitFor(t *testing.T, sy *syncer.Syncer, rev int64) *engine.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := sy.WaitFor(ctx, rev)
	if err != nil {
		t.Fatalf("WaitFor(%d): %v", rev, err)
	}
	return snap
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  syncer.Config
		ok   bool
	}{
		{"a store is enough", syncer.Config{Store: newScripted(0)}, true},
		{"no store", syncer.Config{}, false},
		{"a negative batch", syncer.Config{Store: newScripted(0), MaxBatch: -1}, false},
		{"a negative staleness", syncer.Config{Store: newScripted(0), StaleAfter: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := syncer.New(tt.cfg)
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, syncer.ErrInvalidConfig)) {
				t.Fatalf("New = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestBeforeTheFirstList(t *testing.T) {
	st := newScripted(0)
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if snap := sy.Snapshot(); snap == nil || snap.Len() != 0 || sy.Synced() || !sy.Stale() {
		t.Fatalf("before Run: snapshot %v, synced %v, stale %v", snap, sy.Synced(), sy.Stale())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sy.Run(ctx) }()
	st.events <- store.Event{Revision: 5, Changes: []engine.Change{put(t, "a", 5)}} // not a list
	waitFor(t, sy, 5)
	if sy.Synced() {
		t.Fatal("synced before a Reset")
	}
	st.events <- store.Event{Revision: 6, Reset: true, Changes: []engine.Change{put(t, "a", 5)}}
	waitFor(t, sy, 6)
	if !sy.Synced() || sy.Stale() {
		t.Fatalf("after the Reset: synced %v, stale %v", sy.Synced(), sy.Stale())
	}
	if err := sy.Run(ctx); !errors.Is(err, syncer.ErrRunning) {
		t.Fatalf("a second Run: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A Reset is applied as its difference from what is applied: unchanged
// resources are not touched, vanished ones are deleted.
func TestResetAppliesTheDifference(t *testing.T) {
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st})
	sub := sy.Subscribe(8)
	defer sub.Close()
	st.events <- store.Event{Revision: 10, Reset: true, Changes: []engine.Change{put(t, "a", 3), put(t, "b", 4), put(t, "c", 5)}}
	waitFor(t, sy, 10)
	st.events <- store.Event{Revision: 20, Reset: true, Changes: []engine.Change{put(t, "a", 3), put(t, "b", 12), put(t, "d", 15)}}
	snap := waitFor(t, sy, 20)
	<-sub.Updates()
	u := <-sub.Updates()
	got := map[string]bool{}
	for _, c := range u.Changes {
		got[c.Path] = c.Resource != nil
	}
	want := map[string]bool{
		"default/policies/TrafficPermission/b": true,
		"default/policies/TrafficPermission/d": true,
		"default/policies/TrafficPermission/c": false,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("changes of the second Reset: %v, want %v", got, want)
	}
	if u.Previous.Revision() != 10 || u.Snapshot != snap || snap.Len() != 3 {
		t.Fatalf("update %d → %d, %d resources", u.Previous.Revision(), u.Snapshot.Revision(), snap.Len())
	}
}

// A Reset's deletes name the keys of what they delete: the syncer keeps only
// paths and revisions, and gives a deleted path its key again — a resource's,
// a broken value's under a valid key, and the zero key of a broken value whose
// key is not one (its path rendered from bytes that are not UTF-8).
func TestResetDeletesNameTheirKeys(t *testing.T) {
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st})
	sub := sy.Subscribe(8)
	defer sub.Close()
	broken := store.DecodeItem("default/policies/TrafficPermission/broken", []byte("{"), 6, 6).Change()
	odd := store.DecodeItem("default/policies/TrafficPermission/\xffodd", []byte("{}"), 7, 7).Change()
	if broken.Err == nil || broken.Key.Name != "broken" || odd.Err == nil || odd.Key != (resource.Key{}) {
		t.Fatalf("setup: %+v, %+v", broken, odd)
	}
	st.events <- store.Event{Revision: 10, Reset: true, Changes: []engine.Change{put(t, "a", 3), broken, odd}}
	waitFor(t, sy, 10)
	if n := len(sy.Snapshot().Invalid()); n != 2 {
		t.Fatalf("%d invalid, want 2", n)
	}
	st.events <- store.Event{Revision: 20, Reset: true}
	snap := waitFor(t, sy, 20)
	<-sub.Updates()
	u := <-sub.Updates()
	got := map[string]resource.Key{}
	for _, c := range u.Changes {
		if c.Resource != nil || c.Err != nil {
			t.Fatalf("the second Reset puts %s", c.Path)
		}
		got[c.Path] = c.Key
	}
	want := map[string]resource.Key{
		"default/policies/TrafficPermission/a":      {Kind: resource.KindPolicy, Mesh: "default", Type: "TrafficPermission", Name: "a"},
		"default/policies/TrafficPermission/broken": broken.Key,
		odd.Path: {},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("deletes of the second Reset: %v, want %v", got, want)
	}
	if snap.Len() != 0 || len(snap.Invalid()) != 0 {
		t.Fatalf("after the second Reset: %d resources, %d invalid", snap.Len(), len(snap.Invalid()))
	}
}

// Events already queued are applied as one change set.
func TestQueuedEventsBuildOneSnapshot(t *testing.T) {
	const n = 2000
	st := newScripted(n + 1)
	st.events <- store.Event{Revision: 1, Reset: true}
	for i := range n {
		st.events <- store.Event{Revision: int64(i + 2), Changes: []engine.Change{put(t, fmt.Sprintf("p%d", i), int64(i+2))}}
	}
	sy := run(t, syncer.Config{Store: st})
	snap := waitFor(t, sy, n+1)
	if snap.Len() != n {
		t.Fatalf("%d resources, want %d", snap.Len(), n)
	}
	if built := sy.Snapshots(); built > 2 {
		t.Fatalf("%d snapshots for %d queued events", built, n)
	}
}

func TestMaxBatchBoundsACoalescedSet(t *testing.T) {
	st := newScripted(101)
	st.events <- store.Event{Revision: 1, Reset: true}
	for i := range 100 {
		st.events <- store.Event{Revision: int64(i + 2), Changes: []engine.Change{put(t, fmt.Sprintf("p%d", i), int64(i+2))}}
	}
	sy := run(t, syncer.Config{Store: st, MaxBatch: 10})
	waitFor(t, sy, 101)
	if built := sy.Snapshots(); built < 10 {
		t.Fatalf("%d snapshots for 100 events in batches of 10", built)
	}
}

func TestSlowSubscriberIsDropped(t *testing.T) {
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st})
	slow := sy.Subscribe(1)
	fast := sy.Subscribe(8)
	defer fast.Close()
	// One event at a time, each applied before the next is sent: events
	// already queued would be coalesced into one snapshot.
	st.events <- store.Event{Revision: 1, Reset: true, Changes: []engine.Change{put(t, "a", 1)}}
	waitFor(t, sy, 1)
	for i := int64(2); i <= 4; i++ {
		st.events <- store.Event{Revision: i, Changes: []engine.Change{put(t, "a", i)}}
		waitFor(t, sy, i)
	}
	n := 0
	for range slow.Updates() {
		n++
	}
	if n != 1 || !errors.Is(slow.Err(), syncer.ErrTooSlow) {
		t.Fatalf("slow subscriber: %d updates then %v", n, slow.Err())
	}
	slow.Close() // after a drop: no effect
	for i := int64(1); i <= 4; i++ {
		if u := <-fast.Updates(); u.Snapshot.Revision() != i {
			t.Fatalf("fast subscriber got revision %d, want %d", u.Snapshot.Revision(), i)
		}
	}
	if fast.Err() != nil {
		t.Fatal(fast.Err())
	}
}

func TestProgressAdvancesTheRevisionWithoutAnUpdate(t *testing.T) {
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st})
	sub := sy.Subscribe(8)
	defer sub.Close()
	st.events <- store.Event{Revision: 3, Reset: true, Changes: []engine.Change{put(t, "a", 3)}}
	waitFor(t, sy, 3)
	<-sub.Updates()
	st.events <- store.Event{Revision: 9, Progress: true}
	if snap := waitFor(t, sy, 9); snap.Len() != 1 {
		t.Fatal("progress changed the contents")
	}
	select {
	case u := <-sub.Updates():
		t.Fatalf("a progress was delivered: %+v", u)
	default:
	}
}

// With nothing from the store for StaleAfter, the syncer says it is stale and
// restarts the watch from its revision.
func TestSilenceMakesStaleAndRestartsTheWatch(t *testing.T) {
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st, StaleAfter: 100 * time.Millisecond})
	st.events <- store.Event{Revision: 7, Reset: true, Changes: []engine.Change{put(t, "a", 7)}}
	waitFor(t, sy, 7)
	storetest.Eventually(t, "staleness", sy.Stale)
	storetest.Eventually(t, "a restarted watch", func() bool { return len(st.Watches()) >= 2 })
	if w := st.Watches(); w[0] != 0 || w[1] != 7 {
		t.Fatalf("watches from %v, want 0 then 7", w)
	}
	st.events <- store.Event{Revision: 8, Changes: []engine.Change{del("a", 8)}}
	waitFor(t, sy, 8)
	if sy.Stale() {
		t.Fatal("stale right after an event")
	}
	st.mu.Lock()
	st.connected = false
	st.mu.Unlock()
	if !sy.Stale() || !sy.Status().Stale {
		t.Fatal("not stale while the store is disconnected")
	}
}

func TestWaitFor(t *testing.T) {
	st := memory.New(memory.Config{ProgressInterval: 20 * time.Millisecond})
	defer st.Close()
	sy := run(t, syncer.Config{Store: st})
	rev := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 0)))

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if snap, err := sy.WaitFor(ctx, rev); err != nil || snap.Revision() < rev {
				t.Errorf("WaitFor: %v", err)
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if snap, err := sy.WaitFor(ctx, rev+100); !errors.Is(err, context.Canceled) || snap != nil {
		t.Fatalf("WaitFor with a canceled context: %v, %v", snap, err)
	}
}

// TestNewlyRefusedLogged: a stored document an earlier release accepted and
// the stricter checks refuse is logged at WARN, with its key and the checks,
// when the syncer first applies it; a value broken before is not.
func TestNewlyRefusedLogged(t *testing.T) {
	var buf syncBuffer
	st := newScripted(0)
	sy := run(t, syncer.Config{Store: st, Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	newly := store.DecodeItem("default/workloads/forged",
		[]byte(`{"kind":"Workload","mesh":"default","name":"forged","tags":{"app":"web\u0000env\u0000prod"}}`), 6, 6).Change()
	broken := store.DecodeItem("default/policies/TrafficPermission/broken", []byte("{"), 7, 7).Change()
	st.events <- store.Event{Revision: 10, Reset: true, Changes: []engine.Change{put(t, "a", 3), newly, broken}}
	waitFor(t, sy, 10)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && strings.Contains(fmt.Sprint(m["msg"]), "newly refused") {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["key"] != "default/workloads/forged" ||
		!strings.Contains(fmt.Sprint(lines[0]["checks"]), resource.StricterControl) {
		t.Fatalf("log lines %v, want one WARN naming default/workloads/forged and its check", lines)
	}
}

// syncBuffer is a bytes.Buffer safe for the syncer's goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

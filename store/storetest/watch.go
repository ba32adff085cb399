package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// Follower folds a watch into a snapshot, checking the contract on every
// event: revisions never go back, no change is delivered twice, changes come in
// revision order.
type Follower struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	snap    *engine.Snapshot
	events  []store.Event
	resets  int
	last    int64
	err     error
	closed  bool
	changes int
}

// Follow starts a watch of st from rev; it ends with the test.
func Follow(t testing.TB, st store.Store, from int64) *Follower {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Follower{cancel: cancel, done: make(chan struct{}), snap: engine.Empty()}
	ch := st.Watch(ctx, from)
	go f.run(ch)
	t.Cleanup(func() {
		f.Stop()
		if err := f.Err(); err != nil {
			t.Error(err)
		}
	})
	return f
}

func (f *Follower) run(ch <-chan store.Event) {
	defer close(f.done)
	for ev := range ch {
		f.mu.Lock()
		f.events = append(f.events, ev)
		if err := f.check(ev); err != nil && f.err == nil {
			f.err = err
		}
		switch {
		case ev.Reset:
			f.resets++
			f.snap = engine.Empty().Apply(ev.Revision, ev.Changes)
		default:
			f.snap = f.snap.Apply(max(ev.Revision, f.snap.Revision()), ev.Changes)
		}
		f.changes += len(ev.Changes)
		f.last = max(f.last, ev.Revision)
		f.mu.Unlock()
	}
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
}

func (f *Follower) check(ev store.Event) error {
	if ev.Revision < f.last {
		return fmt.Errorf("event at revision %d after one at %d", ev.Revision, f.last)
	}
	if ev.Progress && len(ev.Changes) > 0 {
		return fmt.Errorf("a progress event at %d carries %d changes", ev.Revision, len(ev.Changes))
	}
	if ev.Reset {
		return nil
	}
	prev := f.last
	for _, c := range ev.Changes {
		if c.ModRevision <= f.last {
			return fmt.Errorf("change of %s at revision %d delivered again (after revision %d)", c.Path, c.ModRevision, f.last)
		}
		if c.ModRevision < prev || c.ModRevision > ev.Revision {
			return fmt.Errorf("change of %s at revision %d out of order in an event at %d", c.Path, c.ModRevision, ev.Revision)
		}
		prev = c.ModRevision
	}
	return nil
}

// Stop ends the watch and waits for its channel to close.
func (f *Follower) Stop() {
	f.cancel()
	<-f.done
}

// Err is the first contract violation seen.
func (f *Follower) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Revision is the revision of the last event.
func (f *Follower) Revision() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Snapshot is the folded state.
func (f *Follower) Snapshot() *engine.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// Resets counts the Reset events.
func (f *Follower) Resets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resets
}

// Events returns a copy of the events so far.
func (f *Follower) Events() []store.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]store.Event(nil), f.events...)
}

// WaitRevision waits until an event at or after rev has arrived.
func (f *Follower) WaitRevision(t testing.TB, rev int64) {
	t.Helper()
	Eventually(t, fmt.Sprintf("the watch to reach revision %d", rev), func() bool { return f.Revision() >= rev })
}

// changesOf returns the changes of the events that are not Resets.
func changesOf(events []store.Event) []engine.Change {
	var out []engine.Change
	for _, ev := range events {
		if !ev.Reset {
			out = append(out, ev.Changes...)
		}
	}
	return out
}

func runWatch(t *testing.T, newHarness Factory) {
	t.Run("from 0: a Reset with everything, then every change in order", func(t *testing.T) {
		st := newHarness(t).Store
		rs := Policies(t, "default", "p", 3)
		ApplyMany(t, st, rs)
		f := Follow(t, st, 0)
		r1 := Apply(t, st, Put(Policy(t, "default", "x", 0)))
		r2 := Apply(t, st, Put(Policy(t, "default", "p-000001", 5)))
		r3 := Apply(t, st, store.Op{Key: rs[2].Key()})
		r4 := Apply(t, st, Put(Policy(t, "other", "y", 0)), Put(Policy(t, "other", "z", 0)))
		f.WaitRevision(t, r4)
		evs := f.Events()
		if !evs[0].Reset || len(evs[0].Changes) < 3 || evs[0].Revision < r1-1 {
			t.Fatalf("first event %+v, want a Reset with the 3 policies", evs[0])
		}
		type step struct {
			path string
			rev  int64
			del  bool
		}
		want := []step{{"default/policies/TrafficPermission/x", r1, false}, {"default/policies/TrafficPermission/p-000001", r2, false},
			{"default/policies/TrafficPermission/p-000002", r3, true}, {"other/policies/TrafficPermission/y", r4, false}, {"other/policies/TrafficPermission/z", r4, false}}
		// The Reset may already hold the first writes; compare the tail.
		var got []step
		for _, c := range changesOf(evs) {
			got = append(got, step{c.Path, c.ModRevision, c.Resource == nil && c.Err == nil})
		}
		if len(got) > len(want) {
			t.Fatalf("changes %+v, want at most %+v", got, want)
		}
		want = want[len(want)-len(got):]
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("change %d = %+v, want %+v (all: %+v)", i, got[i], want[i], got)
			}
		}
		if got := f.Snapshot().Digest(); got != Digest(t, st) {
			t.Fatal("the folded watch differs from the store")
		}
	})

	t.Run("from a revision: the changes after it", func(t *testing.T) {
		st := newHarness(t).Store
		Apply(t, st, Put(Policy(t, "default", "a", 0)))
		r2 := Apply(t, st, Put(Policy(t, "default", "b", 0)))
		r3 := Apply(t, st, Put(Policy(t, "default", "c", 0)))
		f := Follow(t, st, r2)
		f.WaitRevision(t, r3)
		evs := f.Events()
		if f.Resets() != 0 {
			t.Fatalf("a watch from a live revision sent a Reset: %+v", evs)
		}
		cs := changesOf(evs)
		if len(cs) != 1 || cs[0].Path != "default/policies/TrafficPermission/c" || cs[0].ModRevision != r3 {
			t.Fatalf("changes after %d: %+v", r2, cs)
		}
	})

	t.Run("from a compacted revision: a Reset", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		r1 := Apply(t, st, Put(Policy(t, "default", "a", 0)))
		Apply(t, st, Put(Policy(t, "default", "b", 0)))
		r3 := Apply(t, st, Put(Policy(t, "default", "c", 0)))
		if err := h.Compact(Context(t), r3); err != nil {
			t.Fatal(err)
		}
		f := Follow(t, st, r1)
		f.WaitRevision(t, r3)
		evs := f.Events()
		if !evs[0].Reset || len(evs[0].Changes) != 3 {
			t.Fatalf("first event %+v, want a Reset with 3 changes", evs[0])
		}
	})

	t.Run("an interruption with a compaction: re-list, nothing lost or repeated", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		ApplyMany(t, st, Policies(t, "default", "p", 300))
		f := Follow(t, st, 0)
		r := Apply(t, st, Put(Policy(t, "default", "p-000001", 9)))
		f.WaitRevision(t, r)
		resets := f.Resets()

		resume := h.Interrupt()
		ApplyMany(t, h.Writer, Policies(t, "default", "new", 200))
		for i := range 50 {
			Apply(t, h.Writer, store.Op{Key: Policy(t, "default", fmt.Sprintf("p-%06d", i), 0).Key()})
		}
		last := Apply(t, h.Writer, Put(Policy(t, "other", "o", 0)))
		if err := h.Compact(Context(t), last); err != nil {
			t.Fatal(err)
		}
		resume()

		last = Apply(t, st, Put(Policy(t, "default", "after", 0)))
		f.WaitRevision(t, last)
		if f.Resets() == resets {
			t.Fatal("no Reset after the history the watch needed was compacted")
		}
		if f.Snapshot().Digest() != Digest(t, st) {
			t.Fatal("the folded watch differs from the store after the interruption")
		}
	})

	t.Run("idle watches send progress", func(t *testing.T) {
		st := newHarness(t).Store
		r := Apply(t, st, Put(Policy(t, "default", "a", 0)))
		f := Follow(t, st, 0)
		f.WaitRevision(t, r)
		Eventually(t, "a progress event", func() bool {
			for _, ev := range f.Events() {
				if ev.Progress {
					return true
				}
			}
			return false
		})
	})

	t.Run("a watch ends with its context and with Close, and leaves nothing behind", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		Apply(t, st, Put(Policy(t, "default", "a", 0)))
		ctx, cancel := context.WithCancel(context.Background())
		ch := st.Watch(ctx, 0)
		if ev := <-ch; !ev.Reset {
			t.Fatalf("first event %+v", ev)
		}
		cancel()
		drain(t, ch)

		ch = st.Watch(context.Background(), 0)
		<-ch
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		drain(t, ch)
		if _, err := st.Apply(Context(t), []store.Op{Put(Policy(t, "default", "b", 0))}); err == nil {
			t.Fatal("Apply on a closed store succeeded")
		}
	})
}

func drain(t *testing.T, ch <-chan store.Event) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the watch channel was not closed")
		}
	}
}

package admission

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor polls cond with a generous deadline (no timing is asserted).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// stoppedClock holds a limiter's time still: a caller that called once
// stays present.
func stoppedClock(l *Limiter) *time.Time {
	at := time.Unix(1_700_000_000, 0)
	l.now = func() time.Time { return at }
	return &at
}

// present makes key a caller that called just now.
func present(t *testing.T, l *Limiter, key string) {
	t.Helper()
	if err := l.Acquire(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	l.Release(key)
}

func TestOneCallerWaitsOthersDoNot(t *testing.T) {
	t.Parallel()
	l := New(2)
	stoppedClock(l)
	present(t, l, "honest")
	ctx := context.Background()
	for range 2 {
		if err := l.Acquire(ctx, "flood"); err != nil {
			t.Fatal(err)
		}
	}
	// The flood's next calls wait, in order.
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range 5 {
		wg.Go(func() {
			if err := l.Acquire(ctx, "flood"); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
		waitFor(t, "the flood's call queued", func() bool { return l.Waiting("flood") == i+1 })
	}
	// Another caller is admitted at once, however long the flood's queue.
	for range 2 {
		if err := l.Acquire(ctx, "honest"); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Stats(); st.Waiting != 5 || st.Waited != 0 || st.Admitted != 5 || st.Callers != 2 {
		t.Fatalf("stats %+v: want 5 waiting, 5 admitted at once, 2 callers", st)
	}
	l.Release("honest")
	l.Release("honest")
	// Each release of the flood's admits its oldest waiting call.
	for n := 1; n <= 5; n++ {
		l.Release("flood")
		waitFor(t, "a waiting call admitted", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == n
		})
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("admitted in order %v, want the order they came", order)
		}
	}
	for range 2 {
		l.Release("flood")
	}
	if st := l.Stats(); st.Waited != 5 || st.Callers != 0 || st.Waiting != 0 {
		t.Fatalf("stats %+v: want 5 waited, nothing left", st)
	}
}

// TestAloneCallerIsNotHeld: a caller alone runs every call it has; once
// another calls, its calls beyond its share wait, until the other has been
// gone for Recent.
func TestAloneCallerIsNotHeld(t *testing.T) {
	t.Parallel()
	l := New(1)
	clock := stoppedClock(l)
	ctx := context.Background()
	for range 3 {
		if err := l.Acquire(ctx, "gateway"); err != nil { // alone: at once
			t.Fatal(err)
		}
	}
	present(t, l, "sidecar")
	done := make(chan error, 1)
	go func() { done <- l.Acquire(ctx, "gateway") }()
	waitFor(t, "the gateway's fourth call queued", func() bool { return l.Waiting("gateway") == 1 })
	l.Release("gateway") // 2 still executing, over its share of 1: the fourth waits
	if l.Waiting("gateway") != 1 {
		t.Fatal("a waiting call was admitted over the caller's share while another caller is present")
	}
	*clock = clock.Add(Recent)
	l.Release("gateway") // the sidecar is gone: alone again
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		l.Release("gateway")
	}
	if st := l.Stats(); st.Callers != 0 || st.Waiting != 0 || st.Waited != 1 {
		t.Fatalf("stats %+v: want one call waited, nothing left", st)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	l := New(1)
	stoppedClock(l)
	present(t, l, "other")
	if err := l.Acquire(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Acquire(ctx, "k") }()
	waitFor(t, "the call queued", func() bool { return l.Waiting("k") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire = %v, want the context's error", err)
	}
	if st := l.Stats(); st.Waiting != 0 || st.Gave != 1 {
		t.Fatalf("stats %+v: want the waiter gone", st)
	}
	l.Release("k")
	if st := l.Stats(); st.Callers != 0 {
		t.Fatalf("stats %+v: want the caller forgotten", st)
	}
	// The slot is free again.
	if err := l.Acquire(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	l.Release("k")
}

func TestDefaultPerCaller(t *testing.T) {
	t.Parallel()
	if n := New(0).PerCaller(); n < 1 || n != DefaultPerCaller() {
		t.Fatalf("PerCaller = %d, want DefaultPerCaller (at least 1)", n)
	}
}

// TestIdleCallersAreBounded: callers whose calls have ended are kept for
// their next call, but never more than maxIdle of them, and none counts as
// present once Recent has passed.
func TestIdleCallersAreBounded(t *testing.T) {
	t.Parallel()
	l := New(1)
	at := stoppedClock(l)
	for i := range 3 * maxIdle {
		key := string(rune('a'+i%26)) + time.Duration(i).String()
		if err := l.Acquire(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		l.Release(key)
		if n := len(l.callers); n > maxIdle+1 {
			t.Fatalf("after %d callers: %d kept, over %d", i+1, n, maxIdle+1)
		}
	}
	if st := l.Stats(); st.Callers != 0 || st.Waiting != 0 {
		t.Fatalf("stats %+v: want no caller executing or waiting", st)
	}
	// Every caller above is idle and, a Recent later, absent: a caller
	// alone runs beyond its one slot.
	*at = at.Add(Recent)
	for range 3 {
		if err := l.Acquire(context.Background(), "z"); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Stats(); st.Callers != 1 || st.Waiting != 0 {
		t.Fatalf("stats %+v: want one caller, three calls executing", st)
	}
	for range 3 {
		l.Release("z")
	}
}

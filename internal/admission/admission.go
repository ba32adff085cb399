// Package admission admits calls per caller: while other callers are
// present, at most a fixed number of one caller's calls execute at once,
// the others wait — without CPU, in the order they came — until a slot of
// that caller frees or their context ends. One caller's flood then gets at
// most its share of the cores, and a caller with one call in flight never
// queues behind another caller's flood; a caller alone is not held back
// (docs/api.md, "Admission per caller").
//
// It imports neither gRPC nor the server: the server names the caller (its
// verified certificate's identity, else its IP address) and says which
// methods are admitted (a column of its method table).
package admission

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// DefaultPerCaller is the slots of one caller by default: half the cores Go
// may run at once (GOMAXPROCS), at least 1. One caller's flood then leaves
// the other half to everyone else: a call of another caller finds a core
// free rather than waiting for a flood's goroutine to be preempted.
func DefaultPerCaller() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// Recent is how long a caller counts as present after its last call. While
// another caller is present, a caller runs at most its slots at once; alone,
// it runs every call it has: admission never holds back a caller whose
// share nobody else claims (a lone load generator, a single gateway).
const Recent = time.Second

// Limiter holds each caller's slots. The zero value is not usable: New.
type Limiter struct {
	per int
	now func() time.Time // the clock (tests set their own)

	mu sync.Mutex
	// callers are the callers seen, kept while idle (a caller's calls come
	// and go by the thousand a second) until idle ones outnumber maxIdle.
	callers map[string]*caller
	active  int // callers with a call executing or waiting
	stats   Stats
	// The caller that called last and, of the others, the one that called
	// last before it, with the times of their last calls: enough to know
	// whether a caller other than a given one called within Recent.
	lastKey, prevKey string
	lastAt, prevAt   time.Time
}

// caller is one caller's slots in use and its waiting calls, oldest first.
// A caller with no call executing or waiting is idle.
type caller struct {
	running int
	waiting []*waiter
}

type waiter struct {
	ready   chan struct{} // closed when the slot is handed over
	granted bool          // guarded by the limiter's mu
}

// Stats are a limiter's counts since it was made.
type Stats struct {
	Admitted int64 // calls given a slot (at once or after a wait)
	Waited   int64 // of those, the calls that waited for theirs
	Gave     int64 // calls whose context ended while they waited
	Waiting  int   // calls waiting now
	Callers  int   // callers with a call executing or waiting now
}

// New makes a limiter of perCaller slots a caller (DefaultPerCaller when
// perCaller ≤ 0).
func New(perCaller int) *Limiter {
	if perCaller <= 0 {
		perCaller = DefaultPerCaller()
	}
	return &Limiter{per: perCaller, now: time.Now, callers: map[string]*caller{}}
}

// noted records a call of key at now. l.mu is held.
func (l *Limiter) noted(key string, now time.Time) {
	if key != l.lastKey {
		l.prevKey, l.prevAt = l.lastKey, l.lastAt
		l.lastKey = key
	}
	l.lastAt = now
}

// maxIdle bounds the idle callers a limiter keeps.
const maxIdle = 1024

// alone reports whether key is the only caller present at now: no other has
// a call executing or waiting, nor called within Recent. l.mu is held, and
// key is active.
func (l *Limiter) alone(key string, now time.Time) bool {
	if l.active > 1 {
		return false
	}
	other, at := l.lastKey, l.lastAt
	if other == key {
		other, at = l.prevKey, l.prevAt
	}
	return other == "" || now.Sub(at) >= Recent
}

// PerCaller is the slots of one caller.
func (l *Limiter) PerCaller() int { return l.per }

// Acquire takes one of key's slots, waiting for one to free while all are
// taken; it returns ctx's error when ctx ends first (the call then holds no
// slot). Each successful Acquire is followed by exactly one Release of the
// same key.
func (l *Limiter) Acquire(ctx context.Context, key string) error {
	l.mu.Lock()
	c := l.callers[key]
	if c == nil {
		c = &caller{}
		l.callers[key] = c
	}
	if c.running <= 0 && len(c.waiting) == 0 {
		l.active++
	}
	now := l.now()
	admit := len(c.waiting) == 0 && (c.running < l.per || l.alone(key, now))
	l.noted(key, now)
	if admit {
		c.running++
		l.stats.Admitted++
		l.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{})}
	c.waiting = append(c.waiting, w)
	l.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted { // handed a slot as ctx ended: give it on
		l.releaseLocked(key, c)
		return ctx.Err()
	}
	for i, o := range c.waiting {
		if o == w {
			c.waiting = append(c.waiting[:i], c.waiting[i+1:]...)
			break
		}
	}
	l.stats.Gave++
	l.forget(c)
	return ctx.Err()
}

// Release frees one of key's slots: the oldest waiting call of key takes it.
func (l *Limiter) Release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.callers[key]; c != nil {
		l.releaseLocked(key, c)
	}
}

func (l *Limiter) releaseLocked(key string, c *caller) {
	c.running--
	// The oldest waiting calls take the freed slot, and every slot beyond
	// the share once the caller is alone.
	alone := len(c.waiting) > 0 && l.alone(key, l.now())
	for len(c.waiting) > 0 && (c.running < l.per || alone) {
		w := c.waiting[0]
		c.waiting[0] = nil
		c.waiting = c.waiting[1:]
		w.granted = true
		c.running++
		l.stats.Admitted++
		l.stats.Waited++
		close(w.ready)
	}
	l.forget(c)
}

// forget counts a caller that has nothing executing or waiting any more as
// idle, and drops the idle callers once they are over maxIdle. l.mu is held,
// and c was active.
func (l *Limiter) forget(c *caller) {
	if c.running > 0 || len(c.waiting) > 0 {
		return
	}
	l.active--
	if len(l.callers)-l.active <= maxIdle {
		return
	}
	for k, o := range l.callers {
		if o.running <= 0 && len(o.waiting) == 0 {
			delete(l.callers, k)
		}
	}
}

// Stats returns the limiter's counts now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats
	st.Callers = l.active
	for _, c := range l.callers {
		st.Waiting += len(c.waiting)
	}
	return st
}

// Waiting is the calls of key waiting now.
func (l *Limiter) Waiting(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.callers[key]; c != nil {
		return len(c.waiting)
	}
	return 0
}

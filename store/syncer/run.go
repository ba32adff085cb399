package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// Errors of the syncer.
var (
	// ErrInvalidConfig: New refused its Config.
	ErrInvalidConfig = errors.New("invalid syncer config")
	// ErrTooSlow: a subscriber's buffer was full; it was dropped.
	ErrTooSlow = errors.New("subscriber too slow: dropped")
	// ErrRunning: Run was called twice.
	ErrRunning = errors.New("syncer already running")
)

// Defaults of Config.
const (
	DefaultMaxBatch   = 10000
	DefaultStaleAfter = 10 * time.Second
)

// Validate checks the config.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	case c.MaxBatch < 0:
		return fmt.Errorf("%w: MaxBatch %d is negative", ErrInvalidConfig, c.MaxBatch)
	case c.StaleAfter < 0:
		return fmt.Errorf("%w: StaleAfter %v is negative", ErrInvalidConfig, c.StaleAfter)
	}
	return nil
}

// ProgressRequester is implemented by stores whose watches can be asked to
// confirm their revision now (store/etcd). The syncer asks when a WaitFor
// waits for a revision its snapshot has not reached, so that a revision with
// no change under the prefix (a delete of nothing, another prefix's write)
// is confirmed in a round trip rather than at the next progress interval.
type ProgressRequester interface {
	RequestProgress()
}

// Syncer keeps a snapshot in step with a store; see the package comment.
type Syncer struct {
	cfg     Config
	log     *slog.Logger
	snap    atomic.Pointer[engine.Snapshot]
	synced  atomic.Bool
	epoch   time.Time    // monotonic base of last
	last    atomic.Int64 // nanoseconds after epoch of the last event or progress; 0: none
	running atomic.Bool
	built   atomic.Int64 // snapshots built

	mu   sync.Mutex
	wake chan struct{} // closed and replaced on each new snapshot
	subs map[*subscription]struct{}
}

var _ API = (*Syncer)(nil)

// New returns a syncer serving an empty snapshot until Run has synced it.
func New(cfg Config) (*Syncer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Syncer{cfg: cfg, log: log, epoch: time.Now(), wake: make(chan struct{}), subs: map[*subscription]struct{}{}}
	s.snap.Store(engine.Empty())
	return s, nil
}

// Run follows the store until ctx ends, then returns nil. It returns an error
// only when called twice. A watch silent for StaleAfter (no event, not even
// progress) is restarted from the snapshot's revision: the store resumes, or
// re-lists if that revision was compacted.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	pause := 10 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		wctx, cancel := context.WithCancel(ctx)
		events := s.cfg.Store.Watch(wctx, s.snap.Load().Revision())
		silent := s.follow(wctx, events)
		cancel()
		for range events { // the store closes the channel once the watch is gone
		}
		if ctx.Err() != nil {
			break
		}
		if silent {
			s.log.WarnContext(ctx, "watch silent: restarting it", "revision", s.snap.Load().Revision(), "stale_after", s.cfg.StaleAfter)
		} else {
			s.log.WarnContext(ctx, "watch ended: restarting it", "revision", s.snap.Load().Revision())
		}
		// A watch that ends at once (a closed store) is not retried in a spin.
		if time.Since(started) > time.Second {
			pause = 10 * time.Millisecond
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, time.Second)
	}
	return nil
}

// follow applies events until the channel closes, ctx ends, or nothing comes
// for StaleAfter (then it returns true).
func (s *Syncer) follow(ctx context.Context, events <-chan store.Event) (silent bool) {
	timer := time.NewTimer(s.cfg.StaleAfter)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case ev, ok := <-events:
			if !ok {
				return false
			}
			batch := []store.Event{ev}
			n := len(ev.Changes)
		drain:
			for n < s.cfg.MaxBatch {
				select {
				case ev, ok := <-events:
					if !ok {
						break drain
					}
					batch = append(batch, ev)
					n += len(ev.Changes)
				default:
					break drain
				}
			}
			s.apply(batch)
			timer.Reset(s.cfg.StaleAfter)
		}
	}
}

// apply folds a batch of events into one new snapshot.
func (s *Syncer) apply(batch []store.Event) {
	s.last.Store(int64(time.Since(s.epoch)) + 1)
	prev := s.snap.Load()
	rev := prev.Revision()
	var changes []engine.Change
	reset := false
	for _, ev := range batch {
		if ev.Reset {
			// The Reset's difference from what is applied: prev with the
			// batch's changes before it (few: a Reset comes alone, or after
			// the watch's last events).
			applied := prev
			if len(changes) > 0 {
				applied = prev.Apply(rev, changes)
			}
			changes = diff(changes, applied, ev.Changes)
			reset = true
		} else {
			changes = append(changes, ev.Changes...)
		}
		rev = max(rev, ev.Revision)
	}
	if rev == prev.Revision() && len(changes) == 0 {
		if reset {
			s.markSynced(prev)
		}
		return
	}
	s.reportNewlyRefused(changes)
	next := prev.Apply(rev, changes)
	s.snap.Store(next)
	s.built.Add(1)
	s.publish(Update{Snapshot: next, Previous: prev, Changes: changes})
	if reset {
		s.markSynced(next)
	}
}

// reportNewlyRefused logs at WARN each stored value of changes that an
// earlier release accepted and this one refuses (resource.StricterError):
// before the snapshot that closes its mesh or type is served, the log names
// it and why (docs/storage.md, "Checking a store before an upgrade"). Status
// and verdict_stored_refused show the ones stored now.
func (s *Syncer) reportNewlyRefused(changes []engine.Change) {
	for _, c := range changes {
		var se *resource.StricterError
		if c.Err != nil && errors.As(c.Err, &se) {
			s.log.Warn("a stored document is newly refused by a stricter check: it fails closed as an invalid resource",
				"key", c.Path, "checks", se.Checks, "err", c.Err)
		}
	}
}

func (s *Syncer) markSynced(snap *engine.Snapshot) {
	if !s.synced.Swap(true) {
		s.log.Info("synced", "revision", snap.Revision(), "resources", snap.Len())
	}
}

// EachStored calls f with every key snap holds, as the change that put it
// there: its resources, valid or not (Path their key's text, ModRevision
// theirs), and its broken values (Err set). The syncer's snapshot is the
// store at its revision: a Reset is diffed against it, and the server's
// WatchResources feed shows it, with no copy of the store of their own.
func EachStored(snap *engine.Snapshot, f func(c engine.Change)) {
	snap.Resources(func(e engine.Entry) bool {
		f(engine.Change{Path: e.Resource.Key().String(), Key: e.Resource.Key(), Resource: e.Resource,
			ModRevision: e.Resource.Metadata().ModRevision})
		return true
	})
	for _, inv := range snap.Invalid() {
		if inv.Resource == nil {
			f(engine.Change{Path: inv.Path, Key: inv.Key, Err: inv.Err, ModRevision: inv.ModRevision})
		}
	}
}

func modRevision(c engine.Change) int64 {
	if c.Resource != nil {
		if m := c.Resource.Metadata().ModRevision; m != 0 {
			return m
		}
	}
	return c.ModRevision
}

// diff appends to changes what turns applied (a snapshot) into the full
// state of a Reset: the puts and broken values whose mod revision differs,
// and a delete for every key the Reset does not hold. O(state) to compare
// (a transient map of applied's keys), but the snapshot update stays
// O(difference); at rest the syncer holds no state but its snapshot.
func diff(changes []engine.Change, applied *engine.Snapshot, full []engine.Change) []engine.Change {
	if applied.Len() == 0 { // the first list: everything is new
		return append(changes, full...)
	}
	type entry struct {
		key resource.Key
		mod int64
	}
	have := make(map[string]entry, applied.Len())
	EachStored(applied, func(c engine.Change) { have[c.Path] = entry{c.Key, c.ModRevision} })
	for _, c := range full {
		path := c.Path
		if path == "" && c.Resource != nil {
			path = c.Resource.Key().String()
		}
		old, ok := have[path]
		delete(have, path)
		if ok && old.mod == modRevision(c) && old.mod != 0 {
			continue
		}
		changes = append(changes, c)
	}
	for path, e := range have {
		changes = append(changes, engine.Change{Path: path, Key: e.key})
	}
	return changes
}

// publish wakes the waiters and delivers the update to the subscribers.
func (s *Syncer) publish(u Update) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.wake)
	s.wake = make(chan struct{})
	if len(u.Changes) == 0 {
		return
	}
	for sub := range s.subs {
		select {
		case sub.ch <- u:
		default:
			sub.err = fmt.Errorf("%w: %d updates unread at revision %d", ErrTooSlow, cap(sub.ch), u.Snapshot.Revision())
			delete(s.subs, sub)
			close(sub.ch)
		}
	}
}

// Snapshot returns the current snapshot; never nil, never blocks.
func (s *Syncer) Snapshot() *engine.Snapshot { return s.snap.Load() }

// Synced reports whether the first full list has been applied.
func (s *Syncer) Synced() bool { return s.synced.Load() }

// Stale reports whether the snapshot is not known current: not synced yet,
// nothing heard from the store for StaleAfter (a restarted watch is stale
// until it speaks), or the store reporting itself disconnected (which covers
// its re-lists after a failure).
func (s *Syncer) Stale() bool {
	if !s.synced.Load() {
		return true
	}
	if time.Since(s.epoch)-time.Duration(s.last.Load()) > s.cfg.StaleAfter {
		return true
	}
	return !s.cfg.Store.Health().Connected
}

// Status reports the syncer's freshness.
func (s *Syncer) Status() Status {
	snap := s.snap.Load()
	st := Status{Revision: snap.Revision(), Synced: s.synced.Load(), Stale: s.Stale(), Invalid: len(snap.Invalid())}
	if n := s.last.Load(); n != 0 {
		st.LastEventAt = s.epoch.Add(time.Duration(n))
	}
	return st
}

// Snapshots returns how many snapshots the syncer has built (for metrics, and
// to see bursts coalesced).
func (s *Syncer) Snapshots() int64 { return s.built.Load() }

// WaitFor returns a snapshot at or after revision, waiting until ctx ends
// (then ctx's error, unwrapped, and no snapshot).
func (s *Syncer) WaitFor(ctx context.Context, revision int64) (*engine.Snapshot, error) {
	asked := false
	for {
		s.mu.Lock()
		wake := s.wake
		s.mu.Unlock()
		if snap := s.snap.Load(); snap.Revision() >= revision {
			return snap, nil
		}
		if pr, ok := s.cfg.Store.(ProgressRequester); ok && !asked {
			pr.RequestProgress()
			asked = true
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Subscribe returns a subscription to every snapshot built from now on that
// carries changes (a progress that only moves the revision is not delivered).
// Subscribe first, then read Snapshot: nothing after that snapshot is missed,
// and updates at or before its revision may be skipped. A subscriber whose
// buffer is full is dropped: its channel is closed and Err says so.
func (s *Syncer) Subscribe(buffer int) Subscription {
	sub := &subscription{s: s, ch: make(chan Update, max(buffer, 1))}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub
}

type subscription struct {
	s   *Syncer
	ch  chan Update
	err error // set under s.mu
}

func (sub *subscription) Updates() <-chan Update { return sub.ch }

func (sub *subscription) Err() error {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	return sub.err
}

func (sub *subscription) Close() {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	if _, ok := sub.s.subs[sub]; ok {
		delete(sub.s.subs, sub)
		close(sub.ch)
	}
}

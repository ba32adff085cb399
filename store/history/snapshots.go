// Package history answers from the store's past (docs/history.md): engine
// snapshots at any revision or time within the retention window, kept in a
// bounded cache and built from the nearest snapshot at hand; the versions of
// keys with who wrote them and when; the resources that differ between two
// revisions; and the writes that revert keys to a revision.
//
// It reads the store through store.History (store/etcd implements it) and
// imports neither gRPC nor the API's types: the server translates.
package history

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// Defaults of Config.
const (
	DefaultMaxSnapshots = 1024
	DefaultMaxBytes     = 512 << 20
	DefaultMaxDelta     = 20000
	// buildTimeout bounds one snapshot's build, which callers at the same
	// revision share (a caller that gives up does not fail the others).
	buildTimeout = time.Minute
)

// Config configures Snapshots. Zero values take the defaults.
type Config struct {
	// Store is read at past revisions (required).
	Store store.History
	// Current returns the snapshot served now (the syncer's): a revision it
	// is at is answered from it, and past ones are built from it when it is
	// the nearest.
	Current func() *engine.Snapshot
	// MaxSnapshots and MaxBytes bound the cache (default 1024 snapshots,
	// 512 MiB by estimate: see estimate). The least recently used go first.
	MaxSnapshots int
	MaxBytes     int64
	// MaxDelta: a snapshot is built from the nearest one by applying the
	// changes between them while there are at most this many (default
	// 20000, and never more than half the nearest snapshot's resources);
	// beyond, it is built from a full read of the store at its revision.
	MaxDelta int
	// Now reads the clock (default time.Now): at_time after it is refused.
	Now func() time.Time
	// Oldest, when set, is the oldest revision the store is known to hold
	// (store.Storage's, from the replica's maintenance): a cached snapshot
	// below it is dropped and its revision refused as any other compacted
	// one, so that replicas answer alike. nil: learnt from reads alone.
	Oldest func() int64
}

// Snapshots serves engine snapshots at past revisions. Safe for concurrent
// use. Snapshots it builds share one decision memo of their own
// (engine.PastMemo, keyed by epoch: a caller may ask the revisions in any
// order), never the current lineage's.
type Snapshots struct {
	cfg  Config
	memo *engine.Memo

	mu      sync.Mutex
	lru     *list.List // of *entry, most recent first
	byRev   map[int64]*list.Element
	bytes   int64
	flights map[int64]*flight

	hits, misses, deltas, fulls atomic.Int64
	oldest                      atomic.Int64 // the oldest revision reads have found held
}

type entry struct {
	snap  *engine.Snapshot
	bytes int64
}

type flight struct {
	done chan struct{}
	snap *engine.Snapshot
	err  error
}

// New returns the past snapshots of cfg.Store.
func New(cfg Config) (*Snapshots, error) {
	if cfg.Store == nil || cfg.Current == nil {
		return nil, errors.New("history: Store and Current are required")
	}
	if cfg.MaxSnapshots < 0 || cfg.MaxBytes < 0 || cfg.MaxDelta < 0 {
		return nil, errors.New("history: negative bounds")
	}
	if cfg.MaxSnapshots == 0 {
		cfg.MaxSnapshots = DefaultMaxSnapshots
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxDelta == 0 {
		cfg.MaxDelta = DefaultMaxDelta
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Snapshots{cfg: cfg, memo: engine.PastMemo(), lru: list.New(), byRev: map[int64]*list.Element{}, flights: map[int64]*flight{}}, nil
}

// Stats counts what the cache did (metrics, tests).
type Stats struct {
	Hits, Misses   int64 // lookups answered from the cache, and the others
	Deltas, Fulls  int64 // snapshots built from a nearer one, and from a full read
	Entries        int
	EstimatedBytes int64
}

// Stats returns the cache's counters.
func (p *Snapshots) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Hits: p.hits.Load(), Misses: p.misses.Load(), Deltas: p.deltas.Load(), Fulls: p.fulls.Load(),
		Entries: p.lru.Len(), EstimatedBytes: p.bytes}
}

// At returns the snapshot at revision rev: the current one when it is at
// rev, a cached one, or one built now. Errors: a *store.CompactedError (it is
// store.ErrCompacted) for a revision older than the store holds, naming the
// oldest; store.ErrFutureRevision for one the store has not reached;
// store.ErrInvalidArgument for rev ≤ 0.
func (p *Snapshots) At(ctx context.Context, rev int64) (*engine.Snapshot, error) {
	if rev <= 0 {
		return nil, fmt.Errorf("%w: revision %d", store.ErrInvalidArgument, rev)
	}
	if cur := p.cfg.Current(); cur.Revision() == rev {
		return cur, nil
	}
	if floor := p.floor(); rev < floor {
		p.mu.Lock()
		if el, ok := p.byRev[rev]; ok {
			p.remove(el)
		}
		p.mu.Unlock()
		return nil, &store.CompactedError{Revision: rev, Oldest: floor}
	}
	p.mu.Lock()
	if el, ok := p.byRev[rev]; ok {
		p.lru.MoveToFront(el)
		p.mu.Unlock()
		p.hits.Add(1)
		return el.Value.(*entry).snap, nil
	}
	p.misses.Add(1)
	f, ok := p.flights[rev]
	if !ok {
		f = &flight{done: make(chan struct{})}
		p.flights[rev] = f
		go p.fly(context.WithoutCancel(ctx), rev, f)
	}
	p.mu.Unlock()
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// AtTime returns the snapshot at the newest revision known to have been
// committed at or before t (store.History.RevisionAt). A time after now is
// store.ErrFutureRevision.
func (p *Snapshots) AtTime(ctx context.Context, t time.Time) (*engine.Snapshot, error) {
	if now := p.cfg.Now(); t.After(now) {
		return nil, fmt.Errorf("%w: %s is after the server's clock (%s)", store.ErrFutureRevision,
			t.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	rev, err := p.cfg.Store.RevisionAt(ctx, t)
	if err != nil {
		return nil, err
	}
	return p.At(ctx, rev)
}

// floor is the oldest revision known held.
func (p *Snapshots) floor() int64 {
	f := p.oldest.Load()
	if p.cfg.Oldest != nil {
		f = max(f, p.cfg.Oldest())
	}
	return f
}

// fly builds the snapshot at rev for every caller waiting on f, and caches it.
func (p *Snapshots) fly(ctx context.Context, rev int64, f *flight) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	snap, bytes, err := p.build(ctx, rev)
	if ce := (*store.CompactedError)(nil); errors.As(err, &ce) && ce.Oldest > p.oldest.Load() {
		p.oldest.Store(ce.Oldest) // racing raises: a lower value lost costs one read more
	}
	p.mu.Lock()
	delete(p.flights, rev)
	if err == nil {
		p.add(snap, bytes)
	}
	p.mu.Unlock()
	f.snap, f.err = snap, err
	close(f.done)
}

// add caches snap and evicts down to the bounds (p.mu held).
func (p *Snapshots) add(snap *engine.Snapshot, bytes int64) {
	if _, ok := p.byRev[snap.Revision()]; ok {
		return
	}
	p.byRev[snap.Revision()] = p.lru.PushFront(&entry{snap: snap, bytes: bytes})
	p.bytes += bytes
	for p.lru.Len() > p.cfg.MaxSnapshots || p.bytes > p.cfg.MaxBytes && p.lru.Len() > 1 {
		p.remove(p.lru.Back())
	}
}

// remove drops a cached snapshot (p.mu held).
func (p *Snapshots) remove(el *list.Element) {
	e := el.Value.(*entry)
	p.lru.Remove(el)
	delete(p.byRev, e.snap.Revision())
	p.bytes -= e.bytes
}

// nearest is the snapshot nearest rev among the cached ones and the current one.
func (p *Snapshots) nearest(rev int64) *engine.Snapshot {
	best := p.cfg.Current()
	dist := func(s *engine.Snapshot) int64 {
		d := s.Revision() - rev
		return max(d, -d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for el := p.lru.Front(); el != nil; el = el.Next() {
		if s := el.Value.(*entry).snap; dist(s) < dist(best) {
			best = s
		}
	}
	return best
}

// build makes the snapshot at rev: from the nearest snapshot and the changes
// between the two (read with a watch that replays them, each with the value
// it replaced), or, when they are too many, from a full read at rev.
func (p *Snapshots) build(ctx context.Context, rev int64) (*engine.Snapshot, int64, error) {
	base := p.nearest(rev)
	if base.Revision() > 0 {
		limit := min(p.cfg.MaxDelta, max(256, base.Len()/2))
		snap, bytes, ok, err := p.delta(ctx, base, rev, limit)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			p.deltas.Add(1)
			return snap, bytes, nil
		}
	}
	changes, err := p.cfg.Store.StateAt(ctx, rev, "")
	if err != nil {
		return nil, 0, err
	}
	p.fulls.Add(1)
	snap := engine.Empty().WithMemo(p.memo).Apply(rev, changes)
	return snap, estimate(snap.Len()), nil
}

// delta builds the snapshot at rev from base and the changes between them;
// ok false when there are more than limit.
func (p *Snapshots) delta(ctx context.Context, base *engine.Snapshot, rev int64, limit int) (*engine.Snapshot, int64, bool, error) {
	from, to := min(rev, base.Revision()), max(rev, base.Revision())
	vs, more, err := p.cfg.Store.Versions(ctx, "", true, from, to, limit)
	if err != nil || more {
		return nil, 0, false, err
	}
	byPath := map[string]int{}
	var changes []engine.Change
	whole := false // a Mesh or a Scope changed: its mesh is recompiled
	for _, v := range vs {
		var c engine.Change
		switch {
		case rev < base.Revision():
			// Going back: the value each key held at rev is what its first
			// change after rev replaced.
			if _, seen := byPath[v.Path]; seen {
				continue
			}
			if v.Prev == nil {
				c = store.DeleteChange(v.Path, 0)
			} else {
				c = v.Prev.Change()
			}
		case v.Deleted:
			c = store.DeleteChange(v.Path, v.Revision)
		default:
			c = v.Item.Change()
		}
		if i, seen := byPath[v.Path]; seen {
			changes[i] = c
		} else {
			byPath[v.Path] = len(changes)
			changes = append(changes, c)
		}
		if k := c.Key.Kind; k == resource.KindMesh || k == resource.KindScope {
			whole = true
		}
	}
	snap := base.WithMemo(p.memo).Apply(rev, changes)
	bytes := estimate(len(changes))
	if whole {
		bytes = estimate(snap.Len())
	}
	return snap, bytes, true, nil
}

// bytesPerResource is about what a snapshot holds per resource (decoded,
// indexed; BENCHMARKS.md measures 1.9 KB per policy with 50 scopes).
const bytesPerResource = 2048

// estimate is the memory a cached snapshot is charged: its own resources'
// when it was built whole (or recompiled a mesh), else the changes' it does
// not share with the snapshot it was built from, plus the paths above them.
func estimate(resources int) int64 {
	return int64(resources)*bytesPerResource + 16<<10
}

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
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
//
// A lookup takes no lock and writes nothing shared in the common case: the
// cache is an immutable map from revision to entry, replaced whole (under mu)
// when a snapshot is added or dropped, and read with one atomic load.
// Recency is a stamp per entry: the cache's clock ticks at every addition,
// and a hit stamps its entry with the clock unless it already holds it, so an
// entry asked again and again writes once per addition, not once per call.
// The entry with the oldest stamp goes first: least recently used, to within
// the additions in between.
type Snapshots struct {
	cfg  Config
	memo *engine.Memo

	index atomic.Pointer[map[int64]*entry] // immutable once published; replaced under mu
	clock atomic.Int64                     // ticks at every addition

	mu      sync.Mutex // serializes the index's replacements, bytes and flights
	bytes   int64
	flights map[int64]*flight

	hits, misses, deltas, fulls atomic.Int64
	oldest                      atomic.Int64 // the oldest revision reads have found held
}

type entry struct {
	snap  *engine.Snapshot
	bytes int64
	used  atomic.Int64 // the clock when last asked
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
	p := &Snapshots{cfg: cfg, memo: engine.PastMemo(), flights: map[int64]*flight{}}
	p.index.Store(&map[int64]*entry{})
	return p, nil
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
		Entries: len(*p.index.Load()), EstimatedBytes: p.bytes}
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
		if _, ok := (*p.index.Load())[rev]; ok {
			p.mu.Lock()
			p.drop(rev)
			p.mu.Unlock()
		}
		return nil, &store.CompactedError{Revision: rev, Oldest: floor}
	}
	if e, ok := (*p.index.Load())[rev]; ok {
		if now := p.clock.Load(); e.used.Load() != now {
			e.used.Store(now) // racing stamps store clocks of about the same time
		}
		p.hits.Add(1)
		return e.snap, nil
	}
	p.mu.Lock()
	if e, ok := (*p.index.Load())[rev]; ok { // added since the look above
		p.mu.Unlock()
		p.hits.Add(1)
		return e.snap, nil
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

// add caches snap and evicts down to the bounds, least recently used first
// (p.mu held). It publishes a new index: lookups in flight keep the old one.
func (p *Snapshots) add(snap *engine.Snapshot, bytes int64) {
	old := *p.index.Load()
	if _, ok := old[snap.Revision()]; ok {
		return
	}
	e := &entry{snap: snap, bytes: bytes}
	e.used.Store(p.clock.Add(1) - 1) // hits from now on stamp a later clock
	m := make(map[int64]*entry, len(old)+1)
	for rev, o := range old {
		m[rev] = o
	}
	m[snap.Revision()] = e
	p.bytes += bytes
	if len(m) > p.cfg.MaxSnapshots || p.bytes > p.cfg.MaxBytes && len(m) > 1 {
		type use struct {
			used int64 // read once: hits go on stamping while this sorts
			e    *entry
		}
		byUse := make([]use, 0, len(m))
		for _, o := range m {
			byUse = append(byUse, use{o.used.Load(), o})
		}
		slices.SortFunc(byUse, func(a, b use) int { return cmp.Compare(a.used, b.used) })
		for _, u := range byUse {
			if len(m) <= p.cfg.MaxSnapshots && (p.bytes <= p.cfg.MaxBytes || len(m) == 1) {
				break
			}
			if u.e == e {
				continue // the newest, whatever hits share its stamp
			}
			delete(m, u.e.snap.Revision())
			p.bytes -= u.e.bytes
		}
	}
	p.index.Store(&m)
}

// drop removes the cached snapshot at rev, if any (p.mu held).
func (p *Snapshots) drop(rev int64) {
	old := *p.index.Load()
	e, ok := old[rev]
	if !ok {
		return
	}
	m := make(map[int64]*entry, len(old))
	for r, o := range old {
		if r != rev {
			m[r] = o
		}
	}
	p.bytes -= e.bytes
	p.index.Store(&m)
}

// nearest is the snapshot nearest rev among the cached ones and the current one.
func (p *Snapshots) nearest(rev int64) *engine.Snapshot {
	best := p.cfg.Current()
	dist := func(s *engine.Snapshot) int64 {
		d := s.Revision() - rev
		return max(d, -d)
	}
	for _, e := range *p.index.Load() {
		if dist(e.snap) < dist(best) {
			best = e.snap
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

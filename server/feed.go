package server

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/syncer"
)

// Defaults of the resource feed (Config.WatchHistory, Config.WatchHistoryChanges).
const (
	DefaultWatchHistory        = 1024
	DefaultWatchHistoryChanges = 16384
)

// resourceFeed serves WatchResources from the replica's own change feed (the
// syncer's updates), so that the number of streams costs etcd nothing: one
// etcd watch per replica (the syncer's), no etcd read per stream.
//
// It keeps the store's state at its revision — the syncer's snapshot at that
// revision, which holds every stored resource and broken value: the feed
// holds no copy of the store; the API's messages of the state are made when a
// stream asks for a snapshot, once per revision — and a bounded history of
// the recent change sets, each converted once and shared, never modified, by
// every stream. A stream is a cursor into that history:
//   - from_revision 0, or one older than the history: a snapshot of the state
//     from memory (sorted once per revision, shared), then the change sets
//     after it;
//   - from_revision within the history (or ahead of it): the change sets
//     after it, replayed from the history, then live.
//
// The history holds at most WatchHistory change sets and WatchHistoryChanges
// changes (the newest set is always kept). A stream whose next change set has
// left the history has fallen behind: it ends with RESOURCE_EXHAUSTED naming
// the revision to resume from (which then gets a fresh snapshot). A stream
// holds no buffer of its own, so a slow stream costs memory only for the
// history every stream shares.
type resourceFeed struct {
	syncer     syncer.API
	log        *slog.Logger
	maxSets    int
	maxChanges int
	dropped    atomic.Int64 // streams ended for falling behind

	ready   chan struct{} // closed once the state holds a synced snapshot
	started bool          // ready is closed (owned by run)

	mu      sync.Mutex
	rev     int64            // the revision of state
	state   *engine.Snapshot // every stored key at rev (nil before the first reset)
	sorted  []*verdictv1.ResourceChange
	sets    []*changeSet // the history, oldest first
	held    int          // changes in sets
	base    int64        // the history holds every change after base
	nextSeq uint64       // seq of the next change set
	wake    chan struct{}
	// parts is the snapshot at partsRev under partsPrefix as the messages
	// a stream starting from it is sent (snapshotParts), shared and encoded
	// once: the current revision's only, dropped when the state moves on.
	parts       []*encodedMsg
	partsRev    int64
	partsPrefix string
}

// changeSet is the changes that brought the store to rev, converted once.
type changeSet struct {
	seq     uint64
	rev     int64
	changes []*verdictv1.ResourceChange
	// all is the CHANGES message of a stream with no prefix, shared and
	// encoded once.
	all *encodedMsg
}

func newResourceFeed(sy syncer.API, log *slog.Logger, maxSets, maxChanges int) *resourceFeed {
	return &resourceFeed{syncer: sy, log: log, maxSets: maxSets, maxChanges: maxChanges,
		ready: make(chan struct{}), wake: make(chan struct{})}
}

// run follows the syncer until ctx ends, from its first synced snapshot. A
// dropped subscription (the feed fell behind the syncer) is renewed, and the
// difference between the feed's state and the syncer's snapshot becomes one
// change set: streams go on without a gap.
func (f *resourceFeed) run(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !f.syncer.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	for ctx.Err() == nil {
		sub := f.syncer.Subscribe(1024)
		f.reset(f.syncer.Snapshot())
		f.follow(ctx, sub)
		sub.Close()
		if err := sub.Err(); err != nil && ctx.Err() == nil {
			f.log.WarnContext(ctx, "watch feed resubscribes", "err", err)
		}
		select { // never spin on a subscription that keeps ending
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (f *resourceFeed) follow(ctx context.Context, sub syncer.Subscription) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sub.Updates():
			if !ok {
				return
			}
			f.apply(u.Snapshot, u.Changes)
		}
	}
}

// reset brings the state to snap: the first time, the state itself (the
// history starts after it); later, the difference as one change set.
func (f *resourceFeed) reset(snap *engine.Snapshot) {
	f.mu.Lock()
	old := f.state // only run writes it
	f.mu.Unlock()
	first := !f.started
	f.started = true
	if first {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.rev, f.base, f.state, f.sorted, f.parts = snap.Revision(), snap.Revision(), snap, nil, nil
		close(f.ready)
		return
	}
	mods := map[string]int64{} // what old holds: path → mod revision (0: unknown, never equal)
	syncer.EachStored(old, func(c engine.Change) { mods[c.Path] = c.ModRevision })
	var changes []*verdictv1.ResourceChange
	syncer.EachStored(snap, func(c engine.Change) {
		mod, ok := mods[c.Path]
		delete(mods, c.Path)
		if ok && mod == c.ModRevision && mod != 0 {
			return
		}
		changes = append(changes, encodeChange(f.log, c))
	})
	for path := range mods {
		changes = append(changes, &verdictv1.ResourceChange{Key: engine.RenderPath(path), Deleted: true})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if snap.Revision() <= f.rev && len(changes) == 0 {
		return
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].GetKey() < changes[j].GetKey() })
	f.state = snap
	f.pushLocked(max(snap.Revision(), f.rev), changes)
}

// apply records one update of the syncer: the changes that made snap.
func (f *resourceFeed) apply(snap *engine.Snapshot, cs []engine.Change) {
	rev := snap.Revision()
	f.mu.Lock()
	if rev <= f.rev || len(cs) == 0 {
		f.mu.Unlock() // already in the state (an update before the snapshot reset read)
		return
	}
	f.mu.Unlock()
	changes := make([]*verdictv1.ResourceChange, len(cs))
	for i, c := range cs {
		if c.Path == "" && c.Resource != nil { // cs is shared: c is a copy
			c.Path = c.Resource.Key().String()
		}
		changes[i] = encodeChange(f.log, c)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = snap // what the changes made
	f.pushLocked(rev, changes)
}

// pushLocked appends a change set at rev, trims the history and wakes the
// streams.
func (f *resourceFeed) pushLocked(rev int64, changes []*verdictv1.ResourceChange) {
	f.rev, f.sorted, f.parts = rev, nil, nil
	set := &changeSet{seq: f.nextSeq, rev: rev, changes: changes,
		all: newEncoded(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES, Revision: rev, Changes: changes})}
	f.nextSeq++
	f.sets = append(f.sets, set)
	f.held += len(changes)
	drop := 0
	for len(f.sets)-drop > 1 && (len(f.sets)-drop > f.maxSets || f.held > f.maxChanges) {
		f.held -= len(f.sets[drop].changes)
		f.base = f.sets[drop].rev
		drop++
	}
	if drop > 0 {
		clear(f.sets[:drop]) // let the dropped sets go
		f.sets = f.sets[drop:]
	}
	close(f.wake)
	f.wake = make(chan struct{})
}

// encodeChange converts one change of the store for the API. A resource the
// API cannot show (never expected: every decoded resource converts) is shown
// as a broken value with the reason, rather than lost.
func encodeChange(log *slog.Logger, c engine.Change) *verdictv1.ResourceChange {
	rc, err := resourceChange(c)
	if err != nil {
		key := engine.RenderPath(c.Path)
		log.Error("watch: a change does not convert", "key", key, "err", err)
		return &verdictv1.ResourceChange{Key: key, Resource: &verdictv1.StoredResource{Key: key,
			ModRevision: c.ModRevision, Error: "does not convert: " + err.Error()}}
	}
	return rc
}

// start places a new stream: the snapshot it begins with (nil for a resume
// served from the history), the snapshot's revision, and the seq of the
// first change set it reads. Call once the feed is ready.
func (f *resourceFeed) start(from int64) (snapshot []*verdictv1.ResourceChange, rev int64, seq uint64) {
	f.mu.Lock()
	locked := true
	defer func() {
		if locked {
			f.mu.Unlock()
		}
	}()
	// A resume is served from the history only from a set's boundary: the
	// revision of a message the client received (or the history's base). A
	// revision inside a set the syncer coalesced (an Apply's, say) would get
	// that set's earlier changes again: it gets a fresh snapshot instead.
	if from > 0 && from >= f.base {
		i := sort.Search(len(f.sets), func(i int) bool { return f.sets[i].rev > from })
		boundary := from == f.base || (i > 0 && f.sets[i-1].rev == from) || (i == 0 && len(f.sets) == 0 && from == f.rev)
		switch {
		case boundary && i < len(f.sets):
			return nil, from, f.sets[i].seq
		case boundary || from >= f.rev:
			return nil, from, f.nextSeq
		}
	}
	if f.sorted != nil {
		return f.sorted, f.rev, f.nextSeq
	}
	// The state's messages are made outside the lock (110k conversions would
	// hold up the feed's updates and every stream's next), from the snapshot
	// at rev (immutable), and kept for rev's other streams if the state has
	// not moved on meanwhile. A stream reads the change sets after seq either
	// way.
	state, rev, seq := f.state, f.rev, f.nextSeq
	f.mu.Unlock()
	locked = false
	snapshot = make([]*verdictv1.ResourceChange, 0, state.Len())
	syncer.EachStored(state, func(c engine.Change) { snapshot = append(snapshot, encodeChange(f.log, c)) })
	sort.Slice(snapshot, func(i, j int) bool { return snapshot[i].GetKey() < snapshot[j].GetKey() })
	f.mu.Lock()
	locked = true
	if f.rev == rev && f.sorted == nil {
		f.sorted = snapshot
	}
	return snapshot, rev, seq
}

// next returns the change set seq, or (nil, false, wake) when it is not made
// yet (wake is closed when one is), or behind true when it has left the
// history.
func (f *resourceFeed) next(seq uint64) (set *changeSet, behind bool, wake <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq >= f.nextSeq {
		return nil, false, f.wake
	}
	if len(f.sets) == 0 || seq < f.sets[0].seq {
		return nil, true, nil
	}
	return f.sets[seq-f.sets[0].seq], false, nil
}

// snapshotParts is snapshot (the feed's state at rev, from start) under
// prefix as the messages a new stream is sent: parts of at most
// snapshotChunk resources (at least one, the first fresh), then the SYNCED
// marker. They are made once per revision and prefix and shared by every
// stream that starts there: a storm of 1,000 streams from revision 0 encodes
// the snapshot once, not 1,000 times. One revision's parts are kept.
func (f *resourceFeed) snapshotParts(rev int64, prefix string, snapshot []*verdictv1.ResourceChange) []*encodedMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.parts != nil && f.partsRev == rev && f.partsPrefix == prefix {
		return f.parts
	}
	changes := underPrefix(snapshot, prefix)
	var parts []*encodedMsg
	for first := true; first || len(changes) > 0; first = false {
		n := min(len(changes), snapshotChunk)
		parts = append(parts, newEncoded(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT,
			Revision: rev, Fresh: first, Changes: changes[:n:n]}))
		changes = changes[n:]
	}
	parts = append(parts, newEncoded(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, Revision: rev}))
	if rev == f.rev { // the state has not moved on since start
		f.parts, f.partsRev, f.partsPrefix = parts, rev, prefix
	}
	return parts
}

// underPrefix returns the part of sorted (in key order) under prefix.
func underPrefix(sorted []*verdictv1.ResourceChange, prefix string) []*verdictv1.ResourceChange {
	if prefix == "" {
		return sorted
	}
	lo := sort.Search(len(sorted), func(i int) bool { return sorted[i].GetKey() >= prefix })
	hi := lo + sort.Search(len(sorted)-lo, func(i int) bool { return !strings.HasPrefix(sorted[lo+i].GetKey(), prefix) })
	return sorted[lo:hi]
}

// response is the CHANGES message of set for a stream watching prefix; nil
// when nothing in it is under the prefix. The message of a stream with no
// prefix is the shared one, encoded once.
func (set *changeSet) response(prefix string) any {
	if prefix == "" {
		return set.all
	}
	var changes []*verdictv1.ResourceChange
	for _, c := range set.changes {
		if strings.HasPrefix(c.GetKey(), prefix) {
			changes = append(changes, c)
		}
	}
	if len(changes) == 0 {
		return nil
	}
	return &verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES, Revision: set.rev, Changes: changes}
}

// resourceChange is one change of the store as the API shows it (its key
// rendered: engine.RenderPath).
func resourceChange(c engine.Change) (*verdictv1.ResourceChange, error) {
	key := engine.RenderPath(c.Path)
	switch {
	case c.Resource != nil:
		sr, err := apiconv.StoredResource(key, c.Resource, nil)
		return &verdictv1.ResourceChange{Key: key, Resource: sr}, err
	case c.Err != nil:
		sr, err := apiconv.StoredResource(key, nil, c.Err)
		if sr != nil {
			sr.ModRevision = c.ModRevision
		}
		return &verdictv1.ResourceChange{Key: key, Resource: sr}, err
	}
	return &verdictv1.ResourceChange{Key: key, Deleted: true}, nil
}

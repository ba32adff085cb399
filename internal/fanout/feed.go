package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/syncer"
)

// Defaults of the resource feed (FeedConfig).
const (
	DefaultHistory        = 1024
	DefaultHistoryChanges = 16384
)

// snapshotChunk bounds the resources of one SNAPSHOT message.
const snapshotChunk = 500

// The errors the feed and the hub end streams with.
var (
	// ErrFellBehind ends a stream whose client reads too slowly: the feed's
	// next change set left its history, or a hub's newer state waited
	// MaxLag behind an unread message. The client reconnects (the feed's
	// error names the revision to resume from).
	ErrFellBehind = errors.New("watch stream too slow")
	// ErrStopped ends every stream when the server stops (Stop closed).
	ErrStopped = errors.New("server shutting down")
	// ErrTooManyStreams refuses a WatchRules stream over one of the hub's
	// caps (Limits); the error names the cap.
	ErrTooManyStreams = errors.New("too many WatchRules streams")
)

// FeedConfig configures a Feed. Zero sizes take the defaults.
type FeedConfig struct {
	Source Source
	Log    *slog.Logger
	// History bounds the change sets kept for resumes and slow streams;
	// HistoryChanges the changes they hold (the newest set is kept whatever
	// its size).
	History, HistoryChanges int
	// Stop, when closed, ends every stream with ErrStopped.
	Stop <-chan struct{}
	// Dropped is called for each stream ended for falling behind (a metric).
	Dropped func(ctx context.Context)
	// Conditions, when set, judges the standing conditions the policies of
	// each message carry (conditions.go).
	Conditions *conditions.Tracker
}

// Feed serves WatchResources from the replica's own change feed (the
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
// The history holds at most History change sets and HistoryChanges
// changes (the newest set is always kept). A stream whose next change set has
// left the history has fallen behind: it ends with ErrFellBehind naming
// the revision to resume from (which then gets a fresh snapshot). A stream
// holds no buffer of its own, so a slow stream costs memory only for the
// history every stream shares.
type Feed struct {
	src        Source
	log        *slog.Logger
	maxSets    int
	maxChanges int
	stop       <-chan struct{}
	onDrop     func(context.Context)
	conds      *conditions.Tracker
	dropped    atomic.Int64 // streams ended for falling behind

	ready   chan struct{} // closed once the state holds a synced snapshot
	started bool          // ready is closed (owned by Run)

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
	parts       []*Message
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
	all *Message
}

// NewFeed makes a feed; Run follows its source.
func NewFeed(cfg FeedConfig) *Feed {
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.HistoryChanges <= 0 {
		cfg.HistoryChanges = DefaultHistoryChanges
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dropped == nil {
		cfg.Dropped = func(context.Context) {}
	}
	return &Feed{src: cfg.Source, log: cfg.Log, maxSets: cfg.History, maxChanges: cfg.HistoryChanges, stop: cfg.Stop,
		onDrop: cfg.Dropped, conds: cfg.Conditions, ready: make(chan struct{}), wake: make(chan struct{})}
}

// Run follows the source until ctx ends, from its first synced snapshot. A
// renewed subscription (the feed fell behind the syncer) makes the
// difference between the feed's state and the fresh snapshot one change set:
// streams go on without a gap.
func (f *Feed) Run(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !f.src.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	// With conditions, each change set costs a judgement: the sets waiting
	// behind one are taken with it, as one set at the newest revision, so
	// that a burst is judged once (a resume from a revision inside it gets
	// a fresh snapshot, as one inside a set the syncer coalesced does).
	follow(ctx, f.src, 1024, f.log, "watch feed", f.conds != nil, f.reset, func(u syncer.Update) { f.apply(u.Snapshot, u.Changes) })
}

// Revision is the revision of the feed's state: what a stream starting now
// is sent a snapshot of.
func (f *Feed) Revision() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rev
}

// Dropped is the number of streams ended for falling behind.
func (f *Feed) Dropped() int64 { return f.dropped.Load() }

// Serve sends one WatchResources stream (docs/api.md): a snapshot from
// memory and a SYNCED marker (from 0, or older than the history), then every
// change set after it under prefix, each as one CHANGES message. It waits for
// the feed's first synced state. It ends when ctx does, with ErrStopped when
// Stop closes, with ErrFellBehind (naming the revision to resume from) when
// the stream's next change set has left the history, or with send's error.
func (f *Feed) Serve(ctx context.Context, from int64, prefix string, send func(any) error) error {
	select {
	case <-f.stop:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	case <-f.ready:
	}
	snapshot, rev, seq := f.start(from)
	if snapshot != nil {
		for _, part := range f.snapshotParts(rev, prefix, snapshot) {
			if err := send(part); err != nil {
				return err
			}
		}
	}
	for {
		set, behind, wake := f.next(seq)
		switch {
		case behind:
			f.dropped.Add(1)
			f.onDrop(ctx)
			return fmt.Errorf("%w: fell behind; resume from revision %d", ErrFellBehind, rev)
		case set == nil:
			select {
			case <-f.stop:
				return ErrStopped
			case <-ctx.Done():
				return ctx.Err()
			case <-wake:
			}
			continue
		}
		seq++
		if set.rev <= rev {
			continue // a resume from a revision ahead of the history
		}
		if resp := set.response(prefix); resp != nil {
			if err := send(resp); err != nil {
				return err
			}
		}
		rev = set.rev
	}
}

// reset brings the state to snap: the first time, the state itself (the
// history starts after it); later, the difference as one change set.
func (f *Feed) reset(snap *engine.Snapshot) {
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
	type held struct {
		mod int64 // 0: unknown, never equal
		key resource.Key
	}
	mods := map[string]held{} // what old holds, by path
	syncer.EachStored(old, func(c engine.Change) { mods[c.Path] = held{c.ModRevision, c.Key} })
	var changes []*verdictv1.ResourceChange
	var cs []engine.Change // the difference, for the conditions it moved
	syncer.EachStored(snap, func(c engine.Change) {
		h, ok := mods[c.Path]
		delete(mods, c.Path)
		if ok && h.mod == c.ModRevision && h.mod != 0 {
			return
		}
		rc := encodeChange(f.log, c)
		f.fillConditions(snap, c, rc)
		changes = append(changes, rc)
		cs = append(cs, c)
	})
	for path, h := range mods {
		changes = append(changes, &verdictv1.ResourceChange{Key: engine.RenderPath(path), Deleted: true})
		cs = append(cs, engine.Change{Path: path, Key: h.key})
	}
	changes = append(changes, f.movedConditions(old, snap, cs)...)
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
func (f *Feed) apply(snap *engine.Snapshot, cs []engine.Change) {
	rev := snap.Revision()
	f.mu.Lock()
	if rev <= f.rev || len(cs) == 0 {
		f.mu.Unlock() // already in the state (an update before the snapshot reset read)
		return
	}
	prev := f.state // only run writes it
	f.mu.Unlock()
	changes := make([]*verdictv1.ResourceChange, len(cs))
	for i, c := range cs {
		if c.Path == "" && c.Resource != nil { // cs is shared: c is a copy
			c.Path = c.Resource.Key().String()
		}
		changes[i] = encodeChange(f.log, c)
		f.fillConditions(snap, c, changes[i])
	}
	changes = append(changes, f.movedConditions(prev, snap, cs)...)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = snap // what the changes made
	f.pushLocked(rev, changes)
}

// pushLocked appends a change set at rev, trims the history and wakes the
// streams.
func (f *Feed) pushLocked(rev int64, changes []*verdictv1.ResourceChange) {
	f.rev, f.sorted, f.parts = rev, nil, nil
	set := &changeSet{seq: f.nextSeq, rev: rev, changes: changes,
		all: NewMessage(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES, Revision: rev, Changes: changes})}
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
func (f *Feed) start(from int64) (snapshot []*verdictv1.ResourceChange, rev int64, seq uint64) {
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
	syncer.EachStored(state, func(c engine.Change) {
		rc := encodeChange(f.log, c)
		f.fillConditions(state, c, rc)
		snapshot = append(snapshot, rc)
	})
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
func (f *Feed) next(seq uint64) (set *changeSet, behind bool, wake <-chan struct{}) {
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
func (f *Feed) snapshotParts(rev int64, prefix string, snapshot []*verdictv1.ResourceChange) []*Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.parts != nil && f.partsRev == rev && f.partsPrefix == prefix {
		return f.parts
	}
	changes := underPrefix(snapshot, prefix)
	var parts []*Message
	for first := true; first || len(changes) > 0; first = false {
		n := min(len(changes), snapshotChunk)
		parts = append(parts, NewMessage(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT,
			Revision: rev, Fresh: first, Changes: changes[:n:n]}))
		changes = changes[n:]
	}
	parts = append(parts, NewMessage(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, Revision: rev}))
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

// Package syncer keeps an engine snapshot in step with the store: it follows
// Store.Watch, turns events into engine change sets, builds the next snapshot
// (engine.Snapshot.Apply, O(change)), and swaps it in atomically for readers.
//
// Contract (what the server relies on):
//   - Snapshot never blocks and never returns nil (an empty snapshot before the
//     first sync). Readers take no lock.
//   - Synced is false until the first full list has been applied, then true for
//     good; health is SERVING only once it is true.
//   - Stale is true while the watch is not known current (etcd unreachable, a
//     silent watch, a re-list in progress); the last snapshot keeps serving.
//   - WaitFor(ctx, rev) returns a snapshot at or after rev, waiting for the watch
//     until ctx ends (then ctx's error); it never returns an older snapshot.
//   - Subscribe delivers every new snapshot to a subscriber, with the changes that
//     made it, in order; a slow subscriber is dropped (its channel closed, Err
//     set), never allowed to block the syncer.
//   - Bursts are coalesced: events already queued are applied as one change set,
//     so a 10k-policy bulk write builds a few snapshots, not 10k.
//   - A Reset (a store's full list) is applied as its difference from the
//     snapshot (key → mod revision), so the snapshot update stays O(changes);
//     the syncer keeps no copy of the store's state beside its snapshot.
package syncer

import (
	"context"
	"log/slog"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// Config configures a Syncer.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
	// MaxBatch bounds the changes coalesced into one snapshot (default 10000;
	// one event is never split).
	MaxBatch int
	// StaleAfter: with no event (not even progress) for this long, the syncer
	// reports itself stale and restarts the watch from its snapshot's
	// revision: the store resumes, or re-lists if that revision is compacted
	// (default 10s). Stores send progress more often than this when idle.
	StaleAfter time.Duration
}

// Update is one new snapshot and what made it.
type Update struct {
	Snapshot *engine.Snapshot
	Previous *engine.Snapshot
	// Changes applied between Previous and Snapshot; after a Reset, the
	// difference between the two.
	Changes []engine.Change
}

// Status is what the syncer knows of its own freshness.
type Status struct {
	Revision    int64     // the snapshot's revision
	Synced      bool      // the first full list has been applied
	Stale       bool      // the watch is not known current
	LastEventAt time.Time // when the store last said anything (event or progress)
	Invalid     int       // invalid resources in the snapshot
}

// Subscription receives updates; see Syncer.Subscribe.
type Subscription interface {
	// Updates delivers snapshots in order; it is closed by Close or when the
	// subscriber falls too far behind (then Err says so).
	Updates() <-chan Update
	Err() error
	Close()
}

// API is what the server uses of a Syncer.
type API interface {
	Snapshot() *engine.Snapshot
	Synced() bool
	Stale() bool
	Status() Status
	WaitFor(ctx context.Context, revision int64) (*engine.Snapshot, error)
	Subscribe(buffer int) Subscription
}

// Package store is verdict's source of truth: resources kept under one key each
// (docs/storage.md), written in transactions and followed with a watch.
//
// The Store interface is implemented by store/etcd (the real one, on etcd) and
// store/memory (for unit tests); store/storetest runs one contract suite against
// both. Values are the resources' canonical JSON (resource.EncodeJSON), readable
// with `etcdctl get`. A stored value that fails to decode or validate is never an
// error of a read or of the watch: it comes back as an engine.Change with Err set
// (and in List with its error), and everything else goes on.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Errors of the store. Match them with errors.Is; server/errors.go maps them to
// gRPC codes.
var (
	// ErrNotFound: Get of a key that holds nothing.
	ErrNotFound = errors.New("not found")
	// ErrConflict: an Op's ExpectedRevision did not hold (optimistic concurrency).
	// The error names the key; nothing was written.
	ErrConflict = errors.New("revision conflict")
	// ErrTooLarge: the write needs more than one etcd transaction (more than
	// MaxOps operations or MaxTxnBytes bytes). Nothing was written.
	ErrTooLarge = errors.New("write too large for one transaction")
	// ErrCompacted: a watch or a read at a revision the store no longer has.
	ErrCompacted = errors.New("revision compacted")
	// ErrUnavailable: the store cannot be reached now (after the call's deadline).
	ErrUnavailable = errors.New("store unavailable")
	// ErrInvalidArgument: a call the store refuses as written (two ops on one
	// key, an op whose Key is not its Resource's key, a bad page token, a future
	// revision). Nothing was written.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrClosed: a call on a closed store.
	ErrClosed = errors.New("store closed")
)

// DefaultPrefix is the etcd key prefix of verdict's resources: a resource
// with key k (resource.Key.String, "default/mesh") is stored at
// DefaultPrefix + "/" + k.
const DefaultPrefix = "/verdict/v1"

// Limits of one transaction: etcd's defaults (--max-txn-ops, --max-request-bytes).
const (
	MaxOps      = 128
	MaxTxnBytes = 1536 * 1024
)

// Expected revision values of an Op besides a real mod revision.
const (
	AnyRevision  int64 = 0  // no check
	MustNotExist int64 = -1 // create only
)

// Op is one write of an Apply: a put of Resource, or a delete of Key when
// Resource is nil. A put's Key may be left zero (it is Resource.Key()); when
// given it must equal it.
type Op struct {
	Key      resource.Key
	Resource resource.Resource // nil: delete
	// ExpectedRevision: AnyRevision, MustNotExist, or the mod revision the key
	// must hold now (a delete with a revision deletes only that version). A
	// delete with AnyRevision of a key that holds nothing is not an error.
	ExpectedRevision int64
	// Current is what the caller believes the key holds now (from its
	// snapshot), or nil. A store may take it instead of reading the key.
	Current *Current
	// Restore: the put writes an earlier version back (a revert), so its
	// creationTime is the one it carries, not the stored value's; its
	// modificationTime is the write's, as for every put.
	Restore bool
}

// Current is what a write's caller believes a key holds now: the mod
// revision of the stored value (0: nothing stored) and the creationTime that
// value carries (zero: none) — both read from one version of the key, as a
// snapshot holds it. A store may write with it instead of reading the key
// first, guarding the write with that mod revision: when it is current the
// write costs one round trip instead of two; when it is stale (the caller's
// snapshot lags) the guard fails and the store reads the key and writes
// again. A stale Current never makes a write wrong: the stored creationTime
// is kept and a conflict is reported only from what is stored.
type Current struct {
	ModRevision  int64
	CreationTime time.Time
}

// Item is a stored resource as read back.
type Item struct {
	Key            resource.Key
	Path           string            // the key without prefix, its bytes as stored (RenderPath shows it)
	Resource       resource.Resource // nil when Err is set
	Err            error             // why the stored value is unusable
	Value          []byte            // the stored bytes
	CreateRevision int64
	ModRevision    int64
}

// ListOptions selects a page of a List.
type ListOptions struct {
	// Prefix restricts the list to keys starting with it (without the store's
	// prefix): "default/", "default/policies/TrafficLog/".
	Prefix string
	// Limit is the page size; 0 means the store's default (1000).
	Limit int
	// PageToken continues a list; empty starts one.
	PageToken string
	// Revision pins the list; 0 means the current revision. Every page of one
	// list is read at the revision of its first page.
	Revision int64
}

// ListPage is one page of a List.
type ListPage struct {
	Items         []Item
	Revision      int64  // the revision every page of this list is read at
	NextPageToken string // empty on the last page
}

// Event is one step of a watch (see Store.Watch).
type Event struct {
	// Revision the store is at after this event: every change up to it has
	// been delivered. Revisions of successive events never decrease.
	Revision int64
	// Reset: Changes hold the whole state at Revision (the first list, or a
	// re-list after compaction or reconnection); keys not in it are deleted.
	Reset bool
	// Changes are puts, deletes and broken values, in revision order; one
	// event may carry the changes of several revisions (a store coalesces what
	// its reader has not taken yet). Each change's ModRevision is the revision
	// that made it (for a put, also Resource.Metadata().ModRevision).
	Changes []engine.Change
	// Progress: no change; the store is known to be current at Revision.
	Progress bool
}

// Store is verdict's persistence.
type Store interface {
	// Apply writes every op in one transaction, atomically, and returns the
	// revision of the write. Puts are stamped: creationTime is kept from the
	// stored value on update and set to now on create, modificationTime is now
	// (both UTC, only where the resource does not carry them already for a
	// create). It fails with ErrConflict when an expected revision does not hold
	// (the error names the key), ErrTooLarge when the ops do not fit one
	// transaction (checked before anything is sent), ErrInvalidArgument for ops
	// it refuses as written, ErrUnavailable when the backend does not answer in
	// time, and never writes partially. Resources are validated by the caller;
	// Apply only encodes them. With no ops it writes nothing and returns the
	// current revision. A store that keeps history (History) records the
	// write's time and its writer (WithWriter) in the same transaction.
	Apply(ctx context.Context, ops []Op) (revision int64, err error)

	// Get reads one key: ErrNotFound when it holds nothing. A value that does not
	// decode is returned as an Item with Err set, not as an error.
	Get(ctx context.Context, key resource.Key) (Item, error)

	// List reads a page of keys in key order, all pages of one list at one
	// revision. ErrCompacted when that revision is gone, ErrInvalidArgument for
	// a page token that is not one of this list's or a future revision.
	List(ctx context.Context, opts ListOptions) (ListPage, error)

	// Watch follows the store from a revision. fromRevision 0 starts with a Reset
	// event holding the whole state; otherwise the first events are the changes
	// after fromRevision, or a Reset if fromRevision was compacted. Events arrive
	// in revision order; none is lost or repeated: after an interruption the
	// watch cannot resume exactly (compaction, a failed or closed watch, a
	// watch gone silent), the store re-lists and sends a Reset. While it is
	// current and idle the store sends a Progress event at least every progress
	// interval of its configuration, so that a reader can tell silence from
	// calm. Failures are never sent as events: the watch retries on its own
	// and Health reports them. The channel is unbuffered (the store coalesces
	// while its reader is busy) and is closed when ctx ends or the store is
	// closed, and only then.
	Watch(ctx context.Context, fromRevision int64) <-chan Event

	// Health reports whether the store is reachable and current, as last seen.
	Health() Health

	// Close releases the store's connections; watches end (their channels are
	// closed) and Close waits for them. Calls after Close fail with ErrClosed.
	Close() error
}

// Health is the store's view of its own freshness.
type Health struct {
	// Connected: the store's last exchange with its backend succeeded (for
	// etcd: a watch response, a list, or any call that reached etcd; a call the
	// caller gave up on counts for nothing).
	Connected bool
	// Revision is the newest revision the store has seen.
	Revision int64
	// Err is the last error talking to the store, if it is not connected.
	Err error
	// Skipped counts the stored values that failed to decode or validate, each
	// time one was read (a counter for metrics; Snapshot.Invalid lists them).
	Skipped int64
}

// Storage is what a store knows of its backend's storage, for Status and the
// metrics (docs/storage.md, "Retention"); store/etcd reports it while it
// maintains etcd (etcd.Store.Maintain). Zero values are unknown.
type Storage struct {
	// DBSize is the largest database file among the backend's members, in
	// bytes; DBSizeInUse the part of it holding data (the rest is free pages
	// a defragmentation gives back); DBSizeQuota the member's quota, beyond
	// which it refuses writes (the NOSPACE alarm).
	DBSize, DBSizeInUse, DBSizeQuota int64
	// OldestRevision is the revision the backend is compacted to: revisions
	// from it on can be read.
	OldestRevision int64
	// Compactions and Defrags count what this replica made.
	Compactions, Defrags int64
	// Compactor: this replica is the one that compacts.
	Compactor bool
	// Alarms are the backend's raised alarms ("NOSPACE", "CORRUPT"), with
	// the member that raised each: "NOSPACE (member 8e9e05c52164694d)".
	Alarms []string
	// Checks counts the maintenance rounds run (tests wait on it).
	Checks int64
}

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/verdictpdp/verdict/engine"
)

// The store's past (docs/history.md): every write made through verdict is
// recorded in its own transaction with its time and its writer, and a store
// that keeps revisions (store/etcd, within the retention window) reads the
// keys as they were at any of them.

// ErrFutureRevision: a read at a revision the store has not reached.
var ErrFutureRevision = errors.New("revision not reached yet")

// CompactedError is a read below the oldest revision the store still holds
// (it is ErrCompacted); Oldest names that revision, 0 when unknown. At is
// set instead of Revision for a time before every revision known.
type CompactedError struct {
	Revision, Oldest int64
	At               time.Time
}

func (e *CompactedError) Error() string {
	if !e.At.IsZero() {
		return fmt.Sprintf("%s is before the oldest revision known (%d): earlier history has been compacted, or was never recorded",
			e.At.UTC().Format(time.RFC3339Nano), e.Oldest)
	}
	if e.Oldest == 0 {
		return fmt.Sprintf("revision %d is older than the retention window", e.Revision)
	}
	return fmt.Sprintf("revision %d is older than the retention window: the oldest revision held is %d", e.Revision, e.Oldest)
}

func (e *CompactedError) Unwrap() error { return ErrCompacted }

// Writers of writes made in development mode and with the shared token
// (docs/history.md, "Writers"); a client certificate's writer is its SAN.
const (
	WriterToken     = "token"
	WriterAnonymous = "anonymous"
)

type writerKey struct{}

// WithWriter returns ctx carrying the identity of the caller a write is made
// for: Apply records it with the write's time, in the write's transaction.
func WithWriter(ctx context.Context, writer string) context.Context {
	return context.WithValue(ctx, writerKey{}, writer)
}

// WriterOf is the writer WithWriter put in ctx; "" when none.
func WriterOf(ctx context.Context) string {
	w, _ := ctx.Value(writerKey{}).(string)
	return w
}

// WriteRecord is what a store records of one write made through it, in the
// write's own transaction: its revision, the time it stamped (never before
// the time of an earlier record), and who it was made for (WithWriter).
type WriteRecord struct {
	Revision int64
	Time     time.Time
	Writer   string
	// Via names the call that wrote: "apply", "delete", "revert" (WithVia).
	Via string
}

type viaKey struct{}

// WithVia names the call a write is made by ("revert"); recorded beside the
// writer.
func WithVia(ctx context.Context, via string) context.Context {
	return context.WithValue(ctx, viaKey{}, via)
}

// ViaOf is the name WithVia put in ctx; "" when none.
func ViaOf(ctx context.Context) string {
	v, _ := ctx.Value(viaKey{}).(string)
	return v
}

// Version is one change of a key within a window of revisions: a put (Item
// set, its Resource or Err) or a delete (Deleted), with what the key held
// just before (Prev; nil: nothing).
type Version struct {
	Path     string // the key without the store's prefix, as stored
	Revision int64  // the revision of the change
	Deleted  bool
	Item     Item // the value written (zero for a delete)
	Prev     *Item
}

// History is what a store keeps of its past. Reads below the oldest revision
// held fail with a *CompactedError, above the current one with
// ErrFutureRevision.
type History interface {
	// Revision is the store's current revision (a linearizable read).
	Revision(ctx context.Context) (int64, error)
	// Oldest is the oldest revision the store holds: reads at it and after
	// succeed.
	Oldest(ctx context.Context) (int64, error)
	// StateAt reads every key starting with prefix ("" is everything) at
	// revision rev, decoded, as the changes that build it (a Reset's).
	StateAt(ctx context.Context, rev int64, prefix string) ([]engine.Change, error)
	// Versions lists the changes of key (or, with prefix, of every key
	// starting with it: "" is everything) with revisions in (from, to],
	// oldest first, the changes of one revision in the order it made them.
	// With limit > 0 it stops after limit changes and more reports that
	// the window holds others.
	Versions(ctx context.Context, key string, prefix bool, from, to int64, limit int) (_ []Version, more bool, _ error)
	// Records returns the write records of the given revisions, where one
	// exists (a write made around verdict, with etcdctl say, has none).
	Records(ctx context.Context, revisions []int64) (map[int64]WriteRecord, error)
	// RevisionAt is the newest revision known to have been committed at or
	// before t (docs/history.md, "at_time").
	RevisionAt(ctx context.Context, t time.Time) (int64, error)
}

package history

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/writeplan"
	"github.com/verdictpdp/verdict/store"
)

// Query selects the versions of a key, or of every key under a prefix,
// within a window of revisions.
type Query struct {
	Key    string // "default/policies/TrafficPermission/web"; with Prefix, a key prefix ("" all)
	Prefix bool
	// From and To bound the window (From, To]: the versions written after
	// From and up to To. 0: the oldest revision held, the current one.
	From, To  int64
	PageSize  int // at most MaxPageSize; 0: DefaultPageSize
	PageToken string
}

// Page sizes of Versions.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Entry is one version of a key: the change, and the record of the write that
// made it (nil when there is none: a write made around verdict).
type Entry struct {
	store.Version
	Record *store.WriteRecord
}

// Page is a page of versions, oldest first.
type Page struct {
	Entries       []Entry
	From, To      int64 // the window read
	NextPageToken string
}

// pageToken continues a Versions: the query's window and key, and where the
// last page stopped: after the first N changes of revision Rev.
type pageToken struct {
	Key    string `json:"k"`
	Prefix bool   `json:"p"`
	From   int64  `json:"f"`
	To     int64  `json:"t"`
	Rev    int64  `json:"r"`
	N      int    `json:"n"`
}

// Versions returns a page of the versions q selects, each with its write
// record; a page continues where the previous one stopped, in the window the
// first page read.
func Versions(ctx context.Context, st store.History, q Query) (Page, error) {
	size := q.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	tok := pageToken{Key: q.Key, Prefix: q.Prefix, From: q.From, To: q.To}
	if q.PageToken != "" {
		var err error
		if tok, err = decodeToken(q); err != nil {
			return Page{}, err
		}
	} else if err := window(ctx, st, &tok); err != nil {
		return Page{}, err
	}
	from, skip := tok.From, 0
	if tok.Rev > 0 {
		from, skip = tok.Rev-1, tok.N
	}
	vs, more, err := st.Versions(ctx, tok.Key, tok.Prefix, from, tok.To, skip+size)
	if err != nil {
		return Page{}, err
	}
	for skip > 0 && len(vs) > 0 && vs[0].Revision == tok.Rev {
		vs, skip = vs[1:], skip-1
	}
	page := Page{From: tok.From, To: tok.To, Entries: make([]Entry, len(vs))}
	revs := make([]int64, 0, len(vs))
	for i, v := range vs {
		page.Entries[i].Version = v
		if i == 0 || v.Revision != vs[i-1].Revision {
			revs = append(revs, v.Revision)
		}
	}
	if len(revs) > 0 {
		recs, err := st.Records(ctx, revs)
		if err != nil {
			return Page{}, err
		}
		for i := range page.Entries {
			if r, ok := recs[page.Entries[i].Revision]; ok {
				page.Entries[i].Record = &r
			}
		}
	}
	if more && len(vs) > 0 {
		last := vs[len(vs)-1].Revision
		next := tok
		next.Rev, next.N = last, 0
		if last == tok.Rev {
			next.N = tok.N
		}
		for _, v := range vs {
			if v.Revision == last {
				next.N++
			}
		}
		b, _ := json.Marshal(next) // plain fields: never fails
		page.NextPageToken = base64.RawURLEncoding.EncodeToString(b)
	}
	return page, nil
}

// window fills in a query's bounds: 0 is the oldest revision held, the
// current one.
func window(ctx context.Context, st store.History, tok *pageToken) error {
	if tok.To == 0 {
		cur, err := st.Revision(ctx)
		if err != nil {
			return err
		}
		tok.To = cur
	}
	if tok.From == 0 {
		oldest, err := st.Oldest(ctx)
		if err != nil {
			return err
		}
		tok.From = oldest
	}
	if tok.From > tok.To {
		return fmt.Errorf("%w: from revision %d is after to revision %d", store.ErrInvalidArgument, tok.From, tok.To)
	}
	return nil
}

func decodeToken(q Query) (pageToken, error) {
	var t pageToken
	b, err := base64.RawURLEncoding.DecodeString(q.PageToken)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil || t.Key != q.Key || t.Prefix != q.Prefix || t.Rev <= t.From || t.Rev > t.To || t.N <= 0 {
		return pageToken{}, fmt.Errorf("%w: page token %q is not one of this query's", store.ErrInvalidArgument, q.PageToken)
	}
	return t, nil
}

// Difference is one key that differs between two revisions: Before and
// After are what it held at each (nil: nothing).
type Difference struct {
	Path          string
	Before, After *engine.Change
}

// Diff lists the keys under prefix ("" everything) that differ between
// revisions from and to, in key order: added, deleted, or holding another
// document (the times and revisions the store stamps set aside). It reads
// the changes between the two (at most limit, 0: DefaultMaxDelta), or, when
// there are more, both states whole.
func Diff(ctx context.Context, st store.History, prefix string, from, to int64, limit int) ([]Difference, error) {
	if limit <= 0 {
		limit = DefaultMaxDelta
	}
	lo, hi := min(from, to), max(from, to)
	before, after := map[string]*engine.Change{}, map[string]*engine.Change{}
	vs, more, err := st.Versions(ctx, prefix, true, lo, hi, limit)
	if err != nil {
		return nil, err
	}
	if more {
		if before, err = stateMap(ctx, st, lo, prefix); err != nil {
			return nil, err
		}
		if after, err = stateMap(ctx, st, hi, prefix); err != nil {
			return nil, err
		}
	} else {
		for _, v := range vs {
			if _, seen := after[v.Path]; !seen {
				before[v.Path] = nil
				if v.Prev != nil {
					c := v.Prev.Change()
					before[v.Path] = &c
				}
			}
			after[v.Path] = nil
			if !v.Deleted {
				c := v.Item.Change()
				after[v.Path] = &c
			}
		}
	}
	if from > to {
		before, after = after, before
	}
	paths := map[string]bool{}
	for p := range before {
		paths[p] = true
	}
	for p := range after {
		paths[p] = true
	}
	var out []Difference
	for p := range paths {
		b, a := before[p], after[p]
		if same(b, a) {
			continue
		}
		out = append(out, Difference{Path: p, Before: b, After: a})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func stateMap(ctx context.Context, st store.History, rev int64, prefix string) (map[string]*engine.Change, error) {
	changes, err := st.StateAt(ctx, rev, prefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*engine.Change, len(changes))
	for i := range changes {
		out[changes[i].Path] = &changes[i]
	}
	return out, nil
}

// same: both absent, or both the same document (writeplan.Same), or both the
// same stored bytes that do not decode.
func same(a, b *engine.Change) bool {
	switch {
	case a == nil || b == nil:
		return a == b
	case a.Resource != nil && b.Resource != nil:
		return writeplan.Same(a.Resource, b.Resource)
	case a.Resource == nil && b.Resource == nil:
		return bytes.Equal(a.Value, b.Value)
	}
	return false
}

// Revert is the write that brings a key, or every key under a prefix, back
// to what it held at a revision.
type Revert struct {
	Ops     []store.Op          // guarded by what each key holds now
	Puts    []resource.Resource // the documents written back, in key order
	Deletes []resource.Key      // the keys that held nothing then, in key order
	Current int64               // the revision the plan was read at
}

// PlanRevert reads what the keys q selects held at revision to and hold now,
// and returns the write that restores them: each document as it was,
// creationTime included (Op.Restore), each key created since deleted. Every
// op is guarded by the mod revision its key holds now, so the write fails
// with store.ErrConflict if one changes before it commits. With seen > 0 the
// plan fails with store.ErrConflict when a key under q changed after seen
// (the revision the caller read). A value at revision to that does not
// decode cannot be written back: store.ErrInvalidArgument.
func PlanRevert(ctx context.Context, st store.History, key string, prefix bool, to, seen int64) (Revert, error) {
	cur, err := st.Revision(ctx)
	if err != nil {
		return Revert{}, err
	}
	if to > cur {
		return Revert{}, fmt.Errorf("%w: revision %d, the store is at %d", store.ErrFutureRevision, to, cur)
	}
	if seen > cur {
		return Revert{}, fmt.Errorf("%w: revision %d seen, the store is at %d", store.ErrFutureRevision, seen, cur)
	}
	if seen > 0 && seen < cur {
		vs, _, err := st.Versions(ctx, key, prefix, seen, cur, 1)
		if err != nil {
			return Revert{}, err
		}
		if len(vs) > 0 {
			return Revert{}, fmt.Errorf("%w: %s changed at revision %d, after revision %d: read it again", store.ErrConflict,
				store.RenderPath(vs[0].Path), vs[0].Revision, seen)
		}
	}
	then, err := stateMap(ctx, st, to, key)
	if err != nil {
		return Revert{}, err
	}
	now, err := stateMap(ctx, st, cur, key)
	if err != nil {
		return Revert{}, err
	}
	selected := func(p string) bool { return prefix || p == key }
	paths := map[string]bool{}
	for p := range then {
		paths[p] = selected(p)
	}
	for p := range now {
		paths[p] = paths[p] || selected(p)
	}
	sorted := make([]string, 0, len(paths))
	for p, ok := range paths {
		if ok {
			sorted = append(sorted, p)
		}
	}
	sort.Strings(sorted)
	out := Revert{Current: cur}
	for _, p := range sorted {
		old, held := then[p], now[p]
		expected := store.MustNotExist
		if held != nil {
			expected = modRevision(held)
		}
		switch {
		case old == nil && held == nil:
		case old == nil:
			if held.Key.Kind == 0 {
				return Revert{}, fmt.Errorf("%w: %s is not a resource's key: delete it with etcdctl", store.ErrInvalidArgument, store.RenderPath(p))
			}
			out.Deletes = append(out.Deletes, held.Key)
			out.Ops = append(out.Ops, store.Op{Key: held.Key, ExpectedRevision: expected})
		case old.Resource == nil:
			return Revert{}, fmt.Errorf("%w: %s held a value that does not decode at revision %d (%v): it cannot be written back",
				store.ErrInvalidArgument, store.RenderPath(p), to, old.Err)
		case held != nil && held.Resource != nil && writeplan.Same(held.Resource, old.Resource) &&
			held.Resource.Metadata().CreationTime.Equal(old.Resource.Metadata().CreationTime):
			// Already as it was.
		default:
			out.Puts = append(out.Puts, old.Resource)
			out.Ops = append(out.Ops, store.Op{Key: old.Key, Resource: old.Resource, ExpectedRevision: expected, Restore: true})
		}
	}
	if len(out.Ops) > store.MaxOps {
		return Revert{}, fmt.Errorf("%w: reverting %q writes %d keys, over the limit of %d per transaction: revert narrower prefixes",
			store.ErrTooLarge, key, len(out.Ops), store.MaxOps)
	}
	return out, nil
}

// modRevision of what a change says a key holds.
func modRevision(c *engine.Change) int64 {
	if c.Resource != nil {
		return c.Resource.Metadata().ModRevision
	}
	return c.ModRevision
}

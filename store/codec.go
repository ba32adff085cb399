package store

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The helpers below are shared by the implementations, so that both read,
// stamp and check exactly alike.

// RenderPath is engine.RenderPath: how a stored key (without the store's
// prefix) is shown everywhere verdict shows it — Status, List,
// WatchResources, errors and logs. Item.Path, engine changes and the digest
// keep the key's stored bytes: two keys are one only when their bytes are,
// never because they look alike.
func RenderPath(raw string) string { return engine.RenderPath(raw) }

// DecodeItem reads a stored value found at path (the key without the store's
// prefix, as stored). A key that is not a resource's key (docs/storage.md,
// "Keys": its shape, its names, UTF-8), a value that does not decode or validate, or whose
// resource is not the one its key names, comes back with Err set and Resource
// nil; the item's Path is path as stored (show it with RenderPath) and its
// error text valid UTF-8, so a hostile key or value never breaks a read that
// shows it. A decoded resource
// carries the revisions and the SHA-256 of value in its Meta (the snapshot's
// Digest hashes the stored bytes, not a re-encoding).
func DecodeItem(path string, value []byte, createRevision, modRevision int64) Item {
	return DecodeItemInterned(path, value, createRevision, modRevision, nil)
}

// DecodeItemInterned is DecodeItem giving a decoded workload the map of its
// tags that tags holds (or adding its own to it); tags may be nil. A store's
// full list decodes with one TagInterner: 100k workloads over a few thousand
// tag sets keep a few thousand maps, not 100k (the engine would otherwise copy
// each workload to share its tag set's map).
func DecodeItemInterned(path string, value []byte, createRevision, modRevision int64, tags *TagInterner) Item {
	it := Item{Path: path, Value: value, CreateRevision: createRevision, ModRevision: modRevision}
	key, err := resource.ParseKey(path)
	if err != nil {
		it.Err = utf8Error{fmt.Errorf("%w: %w", resource.ErrInvalid, err)}
		return it
	}
	it.Key = key
	r, err := resource.DecodeJSON(value)
	if err != nil {
		if se := resource.AsStricter(err); se != nil {
			// Accepted by an earlier release, refused by this one: reported
			// as such (Status, the syncer's WARN log, verdict_stored_refused).
			err = se
		}
		it.Err = utf8Error{err}
		return it
	}
	if r.Key() != key {
		it.Err = fmt.Errorf("%w: the value is %s %q, not the resource its key names", resource.ErrInvalid, r.Key().Kind, r.Key().String())
		return it
	}
	if w, ok := r.(*resource.Workload); ok && tags != nil {
		w.Tags = tags.intern(w.Tags) // r is ours: WithMeta copies it below
	}
	m := r.Metadata()
	m.CreateRevision, m.ModRevision = createRevision, modRevision
	m.ValueHash = sha256.Sum256(value)
	it.Resource = r.WithMeta(m)
	return it
}

// TagInterner hands out one map per distinct tag set (DecodeItemInterned).
// Safe for concurrent use; the zero value is ready. Its maps are shared:
// never modified (resources are immutable once decoded).
type TagInterner struct {
	mu   sync.Mutex
	maps map[string]map[string]string // canonical text of the set → its map
}

func (ti *TagInterner) intern(tags map[string]string) map[string]string {
	if len(tags) == 0 {
		return tags
	}
	key := resource.TagsKey(tags)
	ti.mu.Lock()
	defer ti.mu.Unlock()
	if m, ok := ti.maps[key]; ok {
		return m
	}
	if ti.maps == nil {
		ti.maps = map[string]map[string]string{}
	}
	ti.maps[key] = tags
	return tags
}

// Change is the item as a change for engine.Snapshot.Apply: a put, or a broken
// value when Err is set (then with its stored bytes, which Digest hashes; a
// decoded resource carries their hash in its Meta instead).
func (it Item) Change() engine.Change {
	c := engine.Change{Path: it.Path, Key: it.Key, Resource: it.Resource, Err: it.Err, ModRevision: it.ModRevision}
	if it.Err != nil {
		c.Value = it.Value
	}
	return c
}

// utf8Error is an error whose text is valid UTF-8 (invalid bytes replaced), so
// that it fits a protobuf string; errors.Is sees the error it wraps.
type utf8Error struct{ err error }

func (e utf8Error) Error() string { return strings.ToValidUTF8(e.err.Error(), "\uFFFD") }
func (e utf8Error) Unwrap() error { return e.err }

// DeleteChange is the change that removes what path (as stored) held, deleted
// at revision.
func DeleteChange(path string, revision int64) engine.Change {
	c := engine.Change{Path: path, ModRevision: revision}
	if k, err := resource.ParseKey(path); err == nil {
		c.Key = k
	}
	return c
}

// CheckOps refuses ops that cannot be one transaction: more than MaxOps
// (ErrTooLarge), two ops on one key, a put whose Key is not its resource's, a
// delete without a key, an expected revision below MustNotExist
// (ErrInvalidArgument). It returns the key of each op.
func CheckOps(ops []Op) ([]resource.Key, error) {
	if len(ops) > MaxOps {
		return nil, fmt.Errorf("%w: %d operations, over the limit of %d per transaction", ErrTooLarge, len(ops), MaxOps)
	}
	keys := make([]resource.Key, len(ops))
	seen := make(map[resource.Key]int, len(ops))
	for i, op := range ops {
		k := op.Key
		if op.Resource != nil {
			rk := op.Resource.Key()
			if k != (resource.Key{}) && k != rk {
				return nil, fmt.Errorf("%w: ops[%d]: key %q is not the resource's key %q", ErrInvalidArgument, i, k.String(), rk.String())
			}
			k = rk
		}
		if k.Kind == 0 {
			return nil, fmt.Errorf("%w: ops[%d]: a delete needs a key", ErrInvalidArgument, i)
		}
		if op.ExpectedRevision < MustNotExist {
			return nil, fmt.Errorf("%w: ops[%d]: expected revision %d", ErrInvalidArgument, i, op.ExpectedRevision)
		}
		if j, dup := seen[k]; dup {
			return nil, fmt.Errorf("%w: ops[%d] and ops[%d] both write %q: one transaction writes a key once", ErrInvalidArgument, j, i, k.String())
		}
		seen[k] = i
		keys[i] = k
	}
	return keys, nil
}

// Conflict is the error of an expected revision that does not hold.
func Conflict(key resource.Key, expected, actual int64) error {
	switch {
	case expected == MustNotExist:
		return fmt.Errorf("%w: %s exists (mod revision %d)", ErrConflict, key.String(), actual)
	case actual == 0:
		return fmt.Errorf("%w: %s does not exist (expected mod revision %d)", ErrConflict, key.String(), expected)
	}
	return fmt.Errorf("%w: %s is at mod revision %d, not %d", ErrConflict, key.String(), actual, expected)
}

// ExpectationHolds reports whether a key whose current mod revision is actual
// (0: absent) satisfies expected.
func ExpectationHolds(expected, actual int64) bool {
	switch expected {
	case AnyRevision:
		return true
	case MustNotExist:
		return actual == 0
	}
	return expected == actual
}

// Stamp sets a put's times (docs/resources.md): on update (stored is the current
// value) creationTime is the stored one and modificationTime is now; on create
// (stored nil) the times the resource carries are kept and missing ones are
// now. Times are UTC.
func Stamp(r resource.Resource, stored []byte, now time.Time) resource.Resource {
	var created time.Time
	ok := false
	if stored != nil {
		created, ok = storedCreationTime(stored)
	}
	return stamp(r, stored != nil, created, ok, now)
}

// StampCurrent is Stamp with the stored value known by its Current (its
// creationTime, zero when it has none; nothing stored when its ModRevision
// is 0).
func StampCurrent(r resource.Resource, cur Current, now time.Time) resource.Resource {
	return stamp(r, cur.ModRevision != 0, cur.CreationTime, !cur.CreationTime.IsZero(), now)
}

// StampRestore sets the times of a put that restores an earlier version
// (Op.Restore): the creationTime it carries is kept (now when it has none),
// modificationTime is now.
func StampRestore(r resource.Resource, now time.Time) resource.Resource {
	m := r.Metadata()
	m.ModificationTime = time.Time{}
	return stamp(r.WithMeta(m), false, time.Time{}, false, now)
}

// stamp is Stamp's rule: exists says a value is stored, created its
// creationTime when known.
func stamp(r resource.Resource, exists bool, created time.Time, known bool, now time.Time) resource.Resource {
	now = now.UTC()
	m := r.Metadata()
	if !exists {
		if m.CreationTime.IsZero() {
			m.CreationTime = now
		}
		if m.ModificationTime.IsZero() {
			m.ModificationTime = now
		}
	} else {
		if known {
			m.CreationTime = created
		} else if m.CreationTime.IsZero() {
			m.CreationTime = now
		}
		m.ModificationTime = now
	}
	m.CreationTime, m.ModificationTime = m.CreationTime.UTC(), m.ModificationTime.UTC()
	m.CreateRevision, m.ModRevision = 0, 0
	return r.WithMeta(m)
}

// storedCreationTime reads creationTime from a stored value, even a broken one.
func storedCreationTime(stored []byte) (time.Time, bool) {
	var doc struct {
		CreationTime string `json:"creationTime"`
	}
	if json.Unmarshal(stored, &doc) != nil || doc.CreationTime == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, doc.CreationTime)
	return t, err == nil
}

// DefaultPageSize is a List page's size when ListOptions.Limit is 0.
const DefaultPageSize = 1000

// pageToken continues a list: its revision and the last key returned.
type pageToken struct {
	Revision int64  `json:"r"`
	After    string `json:"a"`
	// AfterBytes holds After when it is not valid UTF-8 (a JSON string
	// cannot carry such bytes: they would come back as U+FFFD).
	AfterBytes []byte `json:"b,omitempty"`
	Prefix     string `json:"p"`
}

// EncodePageToken returns the token of the page after the key after (as
// stored, without the store's prefix; not its RenderPath), in a list of prefix
// at revision.
func EncodePageToken(prefix string, revision int64, after string) string {
	t := pageToken{Revision: revision, After: after, Prefix: prefix}
	if !utf8.ValidString(after) {
		t.After, t.AfterBytes = "", []byte(after)
	}
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodePageToken reads a token of a list of prefix: its revision and the key
// the page starts after. ErrInvalidArgument when it is not such a token.
func DecodePageToken(prefix, token string) (revision int64, after string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	var t pageToken
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err == nil && t.AfterBytes != nil {
		if t.After != "" {
			err = errors.New("two continuations")
		}
		t.After = string(t.AfterBytes)
	}
	if err != nil || t.Revision <= 0 || t.Prefix != prefix || !strings.HasPrefix(t.After, prefix) {
		return 0, "", fmt.Errorf("%w: page token %q is not one of a list of %q", ErrInvalidArgument, token, prefix)
	}
	return t.Revision, t.After, nil
}

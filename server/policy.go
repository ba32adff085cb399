package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/writeplan"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/syncer"
)

// policyService implements verdict.v1.PolicyService. Every call passed the
// interceptors of the method table (methods.go): its caller is authorized
// and its request validated.
type policyService struct {
	verdictv1.UnimplementedPolicyServiceServer
	log   *slog.Logger
	snaps snapshots // reads, at a min_revision
	store Store     // writes, a key read past the snapshot, the store's revision
	sync  syncStatus
	lists *listCache
	// history reads the store's past (history.go); nil: the store keeps none.
	history store.History
	auth    *authorizer // who a write is recorded for
	// conds judges the policies' standing conditions (conditions.go).
	conds *conditions.Tracker
}

// syncStatus is what Status reports of the syncer.
type syncStatus interface{ Status() syncer.Status }

var _ verdictv1.PolicyServiceServer = policyService{}

// Apply validates the write against the current snapshot (a dry run of the
// result), then writes it in one transaction.
func (s policyService) Apply(ctx context.Context, req *verdictv1.ApplyRequest) (*verdictv1.ApplyResponse, error) {
	w, err := decodeWrite(req.GetResources(), req.GetDeletes(), req.GetExpectedRevisions())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	rev, warnings, err := s.write(s.writing(ctx, "apply"), w, req.GetDryRun())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return &verdictv1.ApplyResponse{Revision: rev, Keys: w.putKeys, Deleted: w.deleteKeys, Warnings: warnings, Results: w.results()}, nil
}

// Delete removes keys in one transaction; a key that holds nothing is NotFound.
func (s policyService) Delete(ctx context.Context, req *verdictv1.DeleteRequest) (*verdictv1.DeleteResponse, error) {
	w, err := decodeWrite(nil, req.GetKeys(), req.GetExpectedRevisions())
	if err == nil {
		err = s.mustExist(ctx, w.deletes)
	}
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	rev, _, err := s.write(s.writing(ctx, "delete"), w, req.GetDryRun())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return &verdictv1.DeleteResponse{Revision: rev}, nil
}

// Get reads one resource from the snapshot, valid or not.
func (s policyService) Get(ctx context.Context, req *verdictv1.GetRequest) (*verdictv1.GetResponse, error) {
	snap, err := s.snaps.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	sr, err := getStored(snap, req.GetKey())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	if req.GetConditions() {
		withConditions(s.conds, snap, req.GetAtRevision() != 0 || req.GetAtTime() != nil, []*verdictv1.StoredResource{sr})
	}
	return &verdictv1.GetResponse{Resource: sr, Revision: snap.Revision()}, nil
}

// List reads a page of the snapshot, in key order; a page after the first
// from a snapshot at or after the first page's revision.
func (s policyService) List(ctx context.Context, req *verdictv1.ListRequest) (*verdictv1.ListResponse, error) {
	minRev, atRev, atTime := req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime()
	if req.GetPageToken() != "" {
		if rev, _, err := store.DecodePageToken(req.GetPrefix(), req.GetPageToken()); err == nil {
			if atRev != 0 || atTime != nil {
				atRev, atTime = rev, nil // the pages of a past list: the first page's revision
			} else {
				minRev = max(minRev, rev)
			}
		}
	}
	snap, err := s.snaps.read(ctx, minRev, atRev, atTime)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	page, next, err := s.lists.page(snap, req.GetPrefix(), req.GetPageToken(), int(req.GetPageSize()))
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	if req.GetConditions() {
		withConditions(s.conds, snap, atRev != 0 || atTime != nil, page)
	}
	return &verdictv1.ListResponse{Resources: page, NextPageToken: next, Revision: snap.Revision()}, nil
}

// Status tells how current the snapshot is and what is invalid in it.
func (s policyService) Status(ctx context.Context, req *verdictv1.StatusRequest) (*verdictv1.StatusResponse, error) {
	sendVersion(ctx)
	snap, err := s.snaps.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	st := s.sync.Status()
	out := &verdictv1.StatusResponse{Revision: snap.Revision(), Synced: st.Synced, Stale: st.Stale,
		Resources: int64(snap.Len()), Digest: snap.Digest(), StoreRevision: s.store.Health().Revision}
	if out.Invalid, err = invalidResources(snap); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	if sr, ok := s.store.(storageReporter); ok {
		out.StoreAlarms = sr.Storage().Alarms
	}
	if s.conds != nil && req.GetConditions() {
		out.Conditions = apiconv.ConditionCounts(s.conds, snap)
	}
	return out, nil
}

// storageReporter is a store that reports its backend's storage (store/etcd
// while it maintains etcd): Status shows its alarms, the metrics its sizes.
type storageReporter interface{ Storage() store.Storage }

// write is a decoded Apply or Delete.
type write struct {
	puts       []resource.Resource
	deletes    []resource.Key
	ops        []store.Op
	putKeys    []string
	deleteKeys []string
	outcomes   []verdictv1.ApplyOutcome // per put, set by write
}

// results is what the write did with each key: its puts, then its deletes.
func (w *write) results() []*verdictv1.ApplyResult {
	out := make([]*verdictv1.ApplyResult, 0, len(w.putKeys)+len(w.deleteKeys))
	for i, k := range w.putKeys {
		out = append(out, &verdictv1.ApplyResult{Key: k, Outcome: w.outcomes[i]})
	}
	for _, k := range w.deleteKeys {
		out = append(out, &verdictv1.ApplyResult{Key: k, Outcome: verdictv1.ApplyOutcome_APPLY_OUTCOME_DELETED})
	}
	return out
}

// decodeWrite decodes resources (the engine's decoder validates them) and
// delete keys, and attaches expected revisions.
func decodeWrite(resources []*verdictv1.Resource, deletes []string, expected map[string]int64) (*write, error) {
	w := &write{}
	var errs fieldErrors
	for i, r := range resources {
		res, err := apiconv.ResourceFromProto(fmt.Sprintf("resources[%d]", i), r)
		if err != nil {
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				return nil, err
			}
			errs.list = append(errs.list, ve.Errors...)
			continue
		}
		w.puts = append(w.puts, res)
	}
	field := "deletes"
	if resources == nil {
		field = "keys"
	}
	for i, k := range deletes {
		w.deletes = append(w.deletes, errs.key(fmt.Sprintf("%s[%d]", field, i), k))
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	written := map[string]bool{}
	for _, r := range w.puts {
		k := r.Key()
		w.putKeys = append(w.putKeys, k.String())
		written[k.String()] = true
		w.ops = append(w.ops, store.Op{Key: k, Resource: r, ExpectedRevision: expectedOf(expected, k.String())})
	}
	for _, k := range w.deletes {
		w.deleteKeys = append(w.deleteKeys, k.String())
		written[k.String()] = true
		w.ops = append(w.ops, store.Op{Key: k, ExpectedRevision: expectedOf(expected, k.String())})
	}
	errs.expected(expected, written)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return w, nil
}

func expectedOf(expected map[string]int64, key string) int64 {
	if rev, ok := expected[key]; ok {
		return rev
	}
	return store.AnyRevision
}

// write checks w against the current snapshot, then stores it unless dryRun.
// It returns the revision of the write, or for a dry run the snapshot's, and
// the warnings of the write (engine.Snapshot.TypeWarnings).
func (s policyService) write(ctx context.Context, w *write, dryRun bool) (int64, []string, error) {
	snap := s.snaps.current()
	if err := snap.CheckApply(w.puts, w.deletes); err != nil {
		return 0, nil, err
	}
	warnings, err := snap.TypeWarnings(w.puts)
	if err != nil {
		return 0, nil, err
	}
	w.outcomes = make([]verdictv1.ApplyOutcome, len(w.puts))
	for i, r := range w.puts {
		w.outcomes[i] = outcomeOf(snap, r)
	}
	if dryRun {
		return snap.Revision(), warnings, nil
	}
	// The snapshot may lag a write made since (a put and its repetition, or a
	// change and its undo, in quick succession): each put's outcome is read
	// from the store.
	if err := s.settleOutcomes(ctx, w); err != nil {
		return 0, nil, err
	}
	ops := make([]store.Op, 0, len(w.ops))
	for i, op := range w.ops {
		if i < len(w.puts) && w.outcomes[i] == verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED {
			continue
		}
		op.Current = currentOf(snap, op.Key)
		ops = append(ops, op)
	}
	// With no op left the store writes nothing and answers its revision.
	rev, err := s.store.Apply(ctx, ops)
	return rev, warnings, err
}

// outcomeOf says what writing r does, as far as snap knows: created,
// configured, or unchanged (writeplan.Same as the stored valid resource).
func outcomeOf(snap *engine.Snapshot, r resource.Resource) verdictv1.ApplyOutcome {
	e, ok := snap.Get(r.Key())
	switch {
	case !ok:
		return verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
	case e.Err == nil && writeplan.Same(e.Resource, r):
		return verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
	}
	return verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
}

// settleOutcomes reads each put from the store (a linearizable read): it is
// unchanged only when the store holds the same document at a revision its
// expected revision allows, created when the store holds nothing, else
// configured.
func (s policyService) settleOutcomes(ctx context.Context, w *write) error {
	for i, r := range w.puts {
		it, err := s.store.Get(ctx, r.Key())
		switch {
		case errors.Is(err, store.ErrNotFound):
			w.outcomes[i] = verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
		case err != nil:
			return err
		case it.Err == nil && writeplan.Same(it.Resource, r) && store.ExpectationHolds(w.ops[i].ExpectedRevision, it.ModRevision):
			w.outcomes[i] = verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
		default:
			// A failed expectation is the store's to report, as a conflict.
			w.outcomes[i] = verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
		}
	}
	return nil
}

// currentOf is what the snapshot says k holds (store.Current): the store may
// write with it in one round trip instead of reading k first; a snapshot that
// lags only costs the store that read. Nil when the snapshot holds k as a
// value that does not decode (its creationTime is unknown here).
func currentOf(snap *engine.Snapshot, k resource.Key) *store.Current {
	e, ok := snap.Get(k)
	if !ok {
		return &store.Current{}
	}
	if e.Resource == nil {
		return nil
	}
	m := e.Resource.Metadata()
	if m.ModRevision == 0 {
		return nil
	}
	return &store.Current{ModRevision: m.ModRevision, CreationTime: m.CreationTime}
}

// mustExist fails with NotFound for the first key that holds nothing. The
// snapshot may lag a write the caller just made, so a miss there is checked in
// the store.
func (s policyService) mustExist(ctx context.Context, keys []resource.Key) error {
	snap := s.snaps.current()
	for _, k := range keys {
		if _, ok := snap.Get(k); ok {
			continue
		}
		if _, err := s.store.Get(ctx, k); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: %s holds nothing", store.ErrNotFound, k)
			}
			return err
		}
	}
	return nil
}

// getStored reads one key of the snapshot: a resource, valid or not, or a
// stored value that does not decode.
func getStored(snap *engine.Snapshot, key string) (*verdictv1.StoredResource, error) {
	k, err := parseKey(key)
	if err != nil {
		return nil, err
	}
	if e, ok := snap.Get(k); ok {
		return apiconv.StoredResource(k.String(), e.Resource, e.Err)
	}
	for _, inv := range snap.Invalid() {
		if inv.Resource == nil && inv.Path == k.String() {
			sr, err := apiconv.StoredResource(k.String(), nil, inv.Err)
			if sr != nil {
				sr.ModRevision = inv.ModRevision
			}
			return sr, err
		}
	}
	return nil, fmt.Errorf("%w: %s holds nothing", store.ErrNotFound, k)
}

// invalidResources lists the snapshot's invalid resources in key order.
func invalidResources(snap *engine.Snapshot) ([]*verdictv1.StoredResource, error) {
	inv := snap.Invalid()
	sort.Slice(inv, func(i, j int) bool { return inv[i].Path < inv[j].Path })
	out := make([]*verdictv1.StoredResource, 0, len(inv))
	for _, r := range inv {
		sr, err := apiconv.StoredResource(engine.RenderPath(r.Path), r.Resource, r.Err)
		if err != nil {
			return nil, err
		}
		if r.Resource == nil {
			sr.ModRevision = r.ModRevision
		}
		out = append(out, sr)
	}
	return out, nil
}

// listCache keeps the sorted entries of the last listed snapshot, so that the
// pages of one list cost O(page), not O(n log n) each.
type listCache struct {
	mu      sync.Mutex
	snap    *engine.Snapshot
	entries []listEntry
}

type listEntry struct {
	path string
	res  resource.Resource
	err  error
	rev  int64 // mod revision of a broken value
}

func (c *listCache) sorted(snap *engine.Snapshot) []listEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snap == snap {
		return c.entries
	}
	entries := make([]listEntry, 0, snap.Len())
	snap.Resources(func(e engine.Entry) bool {
		entries = append(entries, listEntry{path: e.Resource.Key().String(), res: e.Resource, err: e.Err})
		return true
	})
	for _, inv := range snap.Invalid() {
		if inv.Resource == nil {
			entries = append(entries, listEntry{path: engine.RenderPath(inv.Path), err: inv.Err, rev: inv.ModRevision})
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	c.snap, c.entries = snap, entries
	return entries
}

// page returns the entries with prefix after the page token's key. Tokens
// are the store's (store.EncodePageToken: the list's prefix, its first
// page's revision and the last key returned), so that one format and one
// check serve both lists: a token of another prefix is refused, and the
// pages after the first are read from a snapshot at or after the first
// page's revision.
func (c *listCache) page(snap *engine.Snapshot, prefix, token string, size int) ([]*verdictv1.StoredResource, string, error) {
	if size <= 0 {
		size = DefaultPageSize
	}
	after := ""
	if token != "" {
		var err error
		if _, after, err = store.DecodePageToken(prefix, token); err != nil {
			return nil, "", &resource.ValidationError{Errors: []resource.FieldError{{Field: "pageToken",
				Reason: fmt.Sprintf("is not a token of a list of prefix %q", prefix)}}}
		}
	}
	entries := c.sorted(snap)
	i := sort.Search(len(entries), func(i int) bool {
		p := entries[i].path
		return p >= prefix && (after == "" || p > after)
	})
	var out []*verdictv1.StoredResource
	next := ""
	for ; i < len(entries) && strings.HasPrefix(entries[i].path, prefix); i++ {
		if len(out) == size {
			next = store.EncodePageToken(prefix, snap.Revision(), out[len(out)-1].Key)
			break
		}
		e := entries[i]
		sr, err := apiconv.StoredResource(e.path, e.res, e.err)
		if err != nil {
			return nil, "", err
		}
		if e.res == nil {
			sr.ModRevision = e.rev
		}
		out = append(out, sr)
	}
	return out, next, nil
}

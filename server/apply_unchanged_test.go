package server

import (
	"context"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// outcomes is an ApplyResponse's results by key.
func outcomes(resp *verdictv1.ApplyResponse) map[string]verdictv1.ApplyOutcome {
	out := map[string]verdictv1.ApplyOutcome{}
	for _, r := range resp.GetResults() {
		out[r.GetKey()] = r.GetOutcome()
	}
	return out
}

// TestApplyUnchanged: on real etcd, through the generated client, an Apply
// of documents equal to the stored ones (times and revisions aside) writes
// nothing — the store's revision does not move, modificationTime stays —
// says so per key, and answers the current revision; a changed document
// beside unchanged ones is the only one written; a dry run says what each
// document would do.
func TestApplyUnchanged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	syncCtx, stopSync := context.WithCancel(ctx)
	synced := make(chan error, 1)
	go func() { synced <- sy.Run(syncCtx) }()
	defer func() { stopSync(); <-synced }()
	h := start(t, nil, func(c *Config) { c.Syncer, c.Store = sy, st })
	defer h.stop()

	const a, b = "default/policies/TrafficPermission/a", "default/policies/TrafficPermission/b"
	apply := func(dry bool, rs ...*verdictv1.Resource) *verdictv1.ApplyResponse {
		t.Helper()
		resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: rs, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sy.WaitFor(ctx, resp.GetRevision()); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	stored := func(key string) *verdictv1.StoredResource {
		t.Helper()
		resp, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetResource()
	}
	const (
		created    = verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
		configured = verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
		unchanged  = verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
	)

	first := apply(false, sdPolicy("a", "web", "api", ""), sdPolicy("b", "web", "db", "DENY"))
	if got := outcomes(first); got[a] != created || got[b] != created {
		t.Fatalf("first apply: %v, want both created", got)
	}
	before, bBefore := stored(a), stored(b).GetModRevision()

	// Unchanged: nothing written, the current revision answered. The times
	// a re-applied `get` carries are not a change.
	again := sdPolicy("a", "web", "api", "")
	again.GetPolicy().CreationTime = before.GetResource().GetPolicy().GetCreationTime()
	same := apply(false, again, sdPolicy("b", "web", "db", "DENY"))
	if got := outcomes(same); got[a] != unchanged || got[b] != unchanged {
		t.Errorf("second apply: %v, want both unchanged", got)
	}
	if same.GetRevision() != first.GetRevision() {
		t.Errorf("an unchanged apply answered revision %d, want the current %d", same.GetRevision(), first.GetRevision())
	}
	if rev := st.Health().Revision; rev != first.GetRevision() {
		t.Errorf("the store is at revision %d after an unchanged apply, want %d (nothing written)", rev, first.GetRevision())
	}
	if after := stored(a); after.GetModRevision() != before.GetModRevision() ||
		!after.GetResource().GetPolicy().GetModificationTime().AsTime().Equal(before.GetResource().GetPolicy().GetModificationTime().AsTime()) {
		t.Errorf("an unchanged apply rewrote %s: %v, was %v", a, after, before)
	}

	// One changed beside one unchanged: only the changed one is written.
	mixed := apply(false, sdPolicy("a", "web", "api", "DENY"), sdPolicy("b", "web", "db", "DENY"))
	if got := outcomes(mixed); got[a] != configured || got[b] != unchanged {
		t.Errorf("mixed apply: %v, want a configured and b unchanged", got)
	}
	if mixed.GetRevision() <= first.GetRevision() {
		t.Errorf("a changing apply answered revision %d, not after %d", mixed.GetRevision(), first.GetRevision())
	}
	if got := stored(b).GetModRevision(); got != bBefore {
		t.Errorf("%s was rewritten: mod revision %d, want %d", b, got, bBefore)
	}

	// A dry run says what each document would do and writes nothing.
	dry := apply(true, sdPolicy("a", "web", "api", ""), sdPolicy("b", "web", "db", "DENY"), sdPolicy("c", "web", "c", ""))
	if got := outcomes(dry); got["default/policies/TrafficPermission/c"] != created || got[a] != configured || got[b] != unchanged {
		t.Errorf("dry run: %v, want c created, a configured, b unchanged", got)
	}
	if rev := st.Health().Revision; rev != mixed.GetRevision() {
		t.Errorf("a dry run moved the store to revision %d", rev)
	}
}

// TestApplyUnchangedReadsTheStore: a snapshot that lags a write must not
// make a document look unchanged: applying a, then a', then a again at once
// writes a, though the snapshot still holds a.
func TestApplyUnchangedReadsTheStore(t *testing.T) {
	b := newBackend()
	h := start(t, b, nil)
	ctx := ctxT(t)
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "api", "")}}); err != nil {
		t.Fatal(err)
	}
	b.setHold(true) // the snapshot stays at the first write
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "api", "DENY")}}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "api", "")}})
	if err != nil {
		t.Fatal(err)
	}
	b.release()
	if got := outcomes(resp)["default/policies/TrafficPermission/p"]; got != verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED {
		t.Errorf("the undo of a change the snapshot has not seen: %v, want CONFIGURED", got)
	}
	it, err := b.Get(ctx, decodeYAML(t, "kind: Policy\nname: p\nsources: [{}]\ndestinations: [{}]\n")[0].Key())
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := it.Resource.(*resource.Policy); !ok || p.Action == resource.Deny {
		t.Errorf("the store holds %+v, want the last write (no DENY)", it.Resource)
	}
}

// TestApplyRepeatedBeforeTheSnapshotSeesIt: a document applied twice at once
// is unchanged the second time, though the snapshot has not seen the first
// write yet: nothing is written again and the revision stays.
func TestApplyRepeatedBeforeTheSnapshotSeesIt(t *testing.T) {
	b := newBackend()
	h := start(t, b, nil)
	ctx := ctxT(t)
	b.setHold(true) // the snapshot never sees the first write
	first, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("q", "web", "api", "")}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("q", "web", "api", "")}})
	if err != nil {
		t.Fatal(err)
	}
	b.release()
	if got := outcomes(again)["default/policies/TrafficPermission/q"]; got != verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED {
		t.Errorf("the repetition of a write the snapshot has not seen: %v, want UNCHANGED", got)
	}
	if again.GetRevision() != first.GetRevision() {
		t.Errorf("the repetition wrote: revision %d after %d", again.GetRevision(), first.GetRevision())
	}
}

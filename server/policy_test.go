package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

func TestApply(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)

	// A dry run validates and writes nothing.
	dry, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("new", "a", "b", "")}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.GetRevision() != 1 || h.b.Health().Revision != 1 {
		t.Fatalf("dry run wrote: revision %d, store at %d", dry.GetRevision(), h.b.Health().Revision)
	}

	// A write returns its revision, and min_revision reads it back.
	h.b.setHold(true)
	resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("new", "a", "b", "DENY")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRevision() != 2 || len(resp.GetKeys()) != 1 || resp.GetKeys()[0] != "default/policies/TrafficPermission/new" {
		t.Fatalf("apply answered %v", resp)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		h.b.release()
	}()
	d, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: tags("app", "a"), Destination: tags("app", "b"), MinRevision: resp.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	if d.GetPolicy() != "new" || d.GetRevision() < 2 {
		t.Errorf("read after write: %v", d)
	}

	// Optimistic concurrency.
	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("new", "a", "b", "")},
		ExpectedRevisions: map[string]int64{"default/policies/TrafficPermission/new": 1}})
	wantCode(t, err, codes.Aborted)
	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("new", "a", "b", "")},
		ExpectedRevisions: map[string]int64{"default/policies/TrafficPermission/new": 2}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("other", "a", "b", "")},
		ExpectedRevisions: map[string]int64{"default/policies/TrafficPermission/new": 2}})
	if _, ok := violations(wantCode(t, err, codes.InvalidArgument))[`expectedRevisions["default/policies/TrafficPermission/new"]`]; !ok {
		t.Error("an expected revision of a key not written was accepted")
	}
}

func TestApplyValidation(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	many := make([]*verdictv1.Resource, 129)
	for i := range many {
		many[i] = sdPolicy(fmt.Sprintf("p%d", i), "a", "b", "")
	}
	blob := strings.Repeat("x", 400_000)
	large := make([]*verdictv1.Resource, 4)
	for i := range large {
		p := sdPolicy(fmt.Sprintf("big%d", i), "a", "b", "")
		p.GetPolicy().Conf, _ = structpb.NewStruct(map[string]any{"blob": blob})
		large[i] = p
	}
	tests := []struct {
		name  string
		req   *verdictv1.ApplyRequest
		field string
	}{
		{"bad action", &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("ok", "a", "b", ""), sdPolicy("x", "a", "b", "MAYBE")}},
			"resources[1].policy.action"},
		{"unknown scope", &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "s", Scope: "Nope",
			Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}})}}, "resources[0]"},
		{"one key twice", &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("x", "a", "b", ""), sdPolicy("x", "a", "c", "")}},
			"resources[1]"},
		{"deleting a scope in use", &verdictv1.ApplyRequest{Deletes: []string{"prod/scopes/Apps"}}, "prod/policies/TrafficPermission/web-in-apps"},
		{"bad delete key", &verdictv1.ApplyRequest{Deletes: []string{"default/nope"}}, "deletes[0]"},
		{"empty", &verdictv1.ApplyRequest{}, "resources"},
		{"too many for one transaction", &verdictv1.ApplyRequest{Resources: many}, "resources"},
		{"too large for one transaction", &verdictv1.ApplyRequest{Resources: large}, "resources"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := h.pol.Apply(ctxT(t), tc.req)
			st := wantCode(t, err, codes.InvalidArgument)
			if _, ok := violations(st)[tc.field]; !ok {
				t.Errorf("violations %v, want %q", violations(st), tc.field)
			}
		})
	}
	if h.b.Health().Revision != 1 {
		t.Error("a refused write was stored")
	}
}

func TestGetListDelete(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies)...)
	b.putBroken("default/policies/TrafficPermission/broken")
	h := start(t, b, nil)
	ctx := ctxT(t)

	g, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficLog/log-all"})
	if err != nil {
		t.Fatal(err)
	}
	if g.GetResource().GetResource().GetPolicy().GetConf().GetFields()["backend"].GetStringValue() != "splunk" ||
		g.GetResource().GetModRevision() != 1 {
		t.Errorf("get: %v", g)
	}
	g, err = h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficPermission/broken"})
	if err != nil || g.GetResource().GetError() == "" || g.GetResource().GetResource() != nil {
		t.Errorf("get of a broken value: %v, %v", g, err)
	}
	_, err = h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficLog/none"})
	wantCode(t, err, codes.NotFound)
	_, err = h.pol.Get(ctx, &verdictv1.GetRequest{Key: "bad"})
	wantCode(t, err, codes.InvalidArgument)

	var keys []string
	token := ""
	for pages := 0; ; pages++ {
		l, err := h.pol.List(ctx, &verdictv1.ListRequest{PageSize: 2, PageToken: token, Prefix: "default/"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.GetResources() {
			keys = append(keys, r.GetKey())
		}
		if token = l.GetNextPageToken(); token == "" {
			break
		}
		if pages == 0 { // the store's tokens: one of another prefix is refused
			if rev, after, err := store.DecodePageToken("default/", token); err != nil || rev != l.GetRevision() || after != keys[1] {
				t.Errorf("page token %q: %d %q %v", token, rev, after, err)
			}
			_, err := h.pol.List(ctx, &verdictv1.ListRequest{PageSize: 2, PageToken: token, Prefix: "prod/"})
			if _, ok := violations(wantCode(t, err, codes.InvalidArgument))["pageToken"]; !ok {
				t.Errorf("another list's token: %v", err)
			}
		}
		if pages > 10 {
			t.Fatal("the list does not end")
		}
	}
	want := []string{"default/mesh", "default/policies/TrafficLog/log-all", "default/policies/TrafficPermission/broken",
		"default/policies/TrafficPermission/deny-db", "default/policies/TrafficPermission/web-to-backend"}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("list: %v, want %v", keys, want)
	}

	_, err = h.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficLog/none"}})
	wantCode(t, err, codes.NotFound)
	_, err = h.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficLog/log-all"},
		ExpectedRevisions: map[string]int64{"default/policies/TrafficLog/log-all": 7}})
	wantCode(t, err, codes.Aborted)
	d, err := h.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficLog/log-all"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficLog/log-all", MinRevision: d.GetRevision()})
	wantCode(t, err, codes.NotFound)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies)...)
	b.putBroken("default/policies/TrafficPermission/broken")
	h := start(t, b, nil)
	st, err := h.pol.Status(ctxT(t), &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRevision() != 2 || !st.GetSynced() || st.GetStale() || len(st.GetDigest()) != 64 || st.GetResources() != 7 {
		t.Errorf("status %v", st)
	}
	if len(st.GetInvalid()) != 1 || st.GetInvalid()[0].GetKey() != "default/policies/TrafficPermission/broken" ||
		st.GetInvalid()[0].GetError() == "" {
		t.Errorf("invalid %v", st.GetInvalid())
	}
	_, err = h.pol.Status(context.Background(), &verdictv1.StatusRequest{MinRevision: 3}) // waits WaitTimeout
	wantCode(t, err, codes.Unavailable)
}

// recordingStore records the ops of every Apply before the backend runs it.
type recordingStore struct {
	*backend
	mu  sync.Mutex
	ops [][]store.Op
}

func (r *recordingStore) Apply(ctx context.Context, ops []store.Op) (int64, error) {
	r.mu.Lock()
	r.ops = append(r.ops, slices.Clone(ops))
	r.mu.Unlock()
	return r.backend.Apply(ctx, ops)
}

func (r *recordingStore) last() []store.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops[len(r.ops)-1]
}

// TestApplyTellsTheStoreWhatItsSnapshotHolds: each op of a write carries what
// the snapshot holds at its key (store.Op.Current: nothing, or the stored
// version's mod revision and creationTime), so that the etcd store writes in
// one round trip instead of reading the keys first.
func TestApplyTellsTheStoreWhatItsSnapshotHolds(t *testing.T) {
	b := newBackend()
	rec := &recordingStore{backend: b}
	h := start(t, b, func(c *Config) { c.Store = rec })
	ctx := context.Background()
	r1, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "a", "b", "")}})
	if err != nil {
		t.Fatal(err)
	}
	if ops := rec.last(); len(ops) != 1 || ops[0].Current == nil || *ops[0].Current != (store.Current{}) {
		t.Fatalf("a create: ops %+v, want a Current saying nothing is stored", ops)
	}
	if _, err := h.pol.Status(ctx, &verdictv1.StatusRequest{MinRevision: r1.GetRevision()}); err != nil {
		t.Fatal(err)
	}
	key := rec.last()[0].Key
	stored, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "a", "c", "")},
		Deletes: []string{"default/policies/TrafficPermission/none"}}); err != nil {
		t.Fatal(err)
	}
	ops := rec.last()
	want := store.Current{ModRevision: r1.GetRevision(), CreationTime: stored.Resource.Metadata().CreationTime}
	if len(ops) != 2 || ops[0].Current == nil || ops[0].Current.ModRevision != want.ModRevision ||
		!ops[0].Current.CreationTime.Equal(want.CreationTime) {
		t.Fatalf("an update: ops %+v, want the put's Current %+v", ops, want)
	}
	if ops[1].Current == nil || *ops[1].Current != (store.Current{}) {
		t.Fatalf("a delete of a key the snapshot does not hold: Current %+v, want nothing stored", ops[1].Current)
	}
}

package server

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// etcdServer serves a server on an embedded etcd through its syncer, with
// mod applied to its config.
func etcdServer(t *testing.T, mod func(*Config)) (*harness, *etcd.Store) {
	t.Helper()
	ctx := ctxT(t)
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	syncCtx, stopSync := context.WithCancel(context.Background())
	synced := make(chan error, 1)
	go func() { synced <- sy.Run(syncCtx) }()
	t.Cleanup(func() { stopSync(); <-synced })
	h := start(t, nil, func(c *Config) {
		c.Syncer, c.Store = sy, st
		if mod != nil {
			mod(c)
		}
	})
	return h, st
}

// TestPastReads: every read that takes at_revision or at_time answers from
// the store as it was, echoing the revision; the edges of the window and
// the fields that exclude each other have their codes.
func TestPastReads(t *testing.T) {
	t.Parallel()
	h, st := etcdServer(t, nil)
	ctx := ctxT(t)
	apply := func(action string) *verdictv1.ApplyResponse {
		t.Helper()
		resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("web-to-db", "web", "db", action)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	allowed := apply("ALLOW").GetRevision()
	denied := apply("DENY").GetRevision()
	hist, err := h.pol.History(ctx, &verdictv1.HistoryRequest{Key: "default/policies/TrafficPermission/web-to-db"})
	if err != nil {
		t.Fatal(err)
	}
	if len(hist.GetVersions()) != 2 || !strings.HasPrefix(hist.GetVersions()[0].GetWriter(), "anonymous ") ||
		hist.GetVersions()[1].GetPrevious().GetResource().GetPolicy().GetAction() != "ALLOW" {
		t.Fatalf("history: %v", hist)
	}
	allowedAt := hist.GetVersions()[0].GetTime()
	flow := func() *verdictv1.DecideRequest {
		return &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: map[string]string{"app": "web"}},
			Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": "db"}}, MinRevision: denied}
	}
	at := func(rev int64) *verdictv1.DecideRequest { f := flow(); f.MinRevision, f.AtRevision = 0, rev; return f }
	if d, err := h.dec.Decide(ctx, flow()); err != nil || d.GetAction() != verdictv1.Action_ACTION_DENY {
		t.Fatalf("now: %v, %v", d, err)
	}

	cases := []struct {
		name string
		call func() (action verdictv1.Action, rev int64, err error)
		want codes.Code
	}{
		{"Decide at the ALLOW revision", func() (verdictv1.Action, int64, error) {
			d, err := h.dec.Decide(ctx, at(allowed))
			return d.GetAction(), d.GetRevision(), err
		}, codes.OK},
		{"Decide at the time of the ALLOW write", func() (verdictv1.Action, int64, error) {
			f := flow()
			f.MinRevision, f.AtTime = 0, allowedAt
			d, err := h.dec.Decide(ctx, f)
			return d.GetAction(), d.GetRevision(), err
		}, codes.OK},
		{"DecideBatch at the ALLOW revision", func() (verdictv1.Action, int64, error) {
			f := flow()
			f.MinRevision = 0
			b, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{f}, AtRevision: allowed})
			return b.GetResults()[0].GetResponse().GetAction(), b.GetRevision(), err
		}, codes.OK},
		{"Get at the ALLOW revision", func() (verdictv1.Action, int64, error) {
			g, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficPermission/web-to-db", AtRevision: allowed})
			a := verdictv1.Action_ACTION_DENY
			if g.GetResource().GetResource().GetPolicy().GetAction() == "ALLOW" {
				a = verdictv1.Action_ACTION_ALLOW
			}
			return a, g.GetRevision(), err
		}, codes.OK},
		{"List at the ALLOW revision", func() (verdictv1.Action, int64, error) {
			l, err := h.pol.List(ctx, &verdictv1.ListRequest{Prefix: "default/policies/", AtRevision: allowed})
			a := verdictv1.Action_ACTION_DENY
			if len(l.GetResources()) == 1 && l.GetResources()[0].GetResource().GetPolicy().GetAction() == "ALLOW" {
				a = verdictv1.Action_ACTION_ALLOW
			}
			return a, l.GetRevision(), err
		}, codes.OK},
		{"Resolve at the ALLOW revision", func() (verdictv1.Action, int64, error) {
			r, err := h.dec.Resolve(ctx, &verdictv1.ResolveRequest{Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": "db"}},
				Source: &verdictv1.Endpoint{Tags: map[string]string{"app": "web"}}, AtRevision: allowed})
			return verdictv1.Action_ACTION_ALLOW, r.GetRevision(), err
		}, codes.OK},
		{"Decide at a revision not reached", func() (verdictv1.Action, int64, error) {
			_, err := h.dec.Decide(ctx, at(denied+1000))
			return 0, 0, err
		}, codes.OutOfRange},
		{"Decide at a time after now", func() (verdictv1.Action, int64, error) {
			f := flow()
			f.MinRevision, f.AtTime = 0, timestamppb.New(time.Now().Add(time.Hour))
			_, err := h.dec.Decide(ctx, f)
			return 0, 0, err
		}, codes.OutOfRange},
		{"Decide with min_revision and at_revision", func() (verdictv1.Action, int64, error) {
			f := flow()
			f.AtRevision = allowed
			_, err := h.dec.Decide(ctx, f)
			return 0, 0, err
		}, codes.InvalidArgument},
		{"Decide with a negative at_revision", func() (verdictv1.Action, int64, error) {
			_, err := h.dec.Decide(ctx, at(-4))
			return 0, 0, err
		}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		action, rev, err := tc.call()
		wantCode(t, err, tc.want)
		if tc.want == codes.OK && (action != verdictv1.Action_ACTION_ALLOW || rev != allowed) {
			t.Errorf("%s: %v at revision %d, want ALLOW at %d", tc.name, action, rev, allowed)
		}
	}

	// A flow of a batch that names its own past is refused in its entry.
	f := flow()
	f.MinRevision, f.AtRevision = 0, allowed
	b, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{f}})
	if err != nil || b.GetResults()[0].GetError().GetCode() != "InvalidArgument" {
		t.Errorf("a batch flow's own at_revision: %v, %v", b, err)
	}

	// Compacted past the ALLOW revision: FailedPrecondition naming the
	// oldest (for a revision not cached: a cached one answers until the
	// replica's maintenance learns of the compaction, history.Config.Oldest).
	if _, err := st.Client().Compact(ctx, denied); err != nil {
		t.Fatal(err)
	}
	_, err = h.dec.Decide(ctx, at(allowed-1))
	if s := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(s.Message(), "oldest revision held is "+strconv.FormatInt(denied, 10)) {
		t.Errorf("below the retention window: %q does not name the oldest revision %d", s.Message(), denied)
	}
}

// TestPastNeedsAuthorization: with a token configured, a decision that
// reads the past needs it; the same decision of now does not.
func TestPastNeedsAuthorization(t *testing.T) {
	t.Parallel()
	h, _ := etcdServer(t, func(c *Config) { c.Token = "history-token" })
	authed := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer history-token")
	resp, err := h.pol.Apply(authed, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "db", "ALLOW")}})
	if err != nil {
		t.Fatal(err)
	}
	f := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: map[string]string{"app": "web"}},
		Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": "db"}}, AtRevision: resp.GetRevision()}
	_, err = h.dec.Decide(ctxT(t), f)
	wantCode(t, err, codes.Unauthenticated)
	_, err = h.dec.Resolve(ctxT(t), &verdictv1.ResolveRequest{Destination: f.Destination, AtRevision: resp.GetRevision()})
	wantCode(t, err, codes.Unauthenticated)
	if _, err := h.dec.Decide(authed, f); err != nil {
		t.Errorf("with the token: %v", err)
	}
	f.AtRevision, f.MinRevision = 0, resp.GetRevision()
	if _, err := h.dec.Decide(ctxT(t), f); err != nil {
		t.Errorf("a plain decide without the token: %v", err)
	}
	hist, err := h.pol.History(authed, &verdictv1.HistoryRequest{Key: "default/", Prefix: true})
	if err != nil || len(hist.GetVersions()) != 1 || hist.GetVersions()[0].GetWriter() != "token" {
		t.Errorf("the write's writer: %v, %v", hist, err)
	}
}

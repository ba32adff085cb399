package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func recvN[T any](t *testing.T, s grpc.ServerStreamingClient[T], n int) []*T {
	t.Helper()
	var out []*T
	for range n {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d messages: %v", len(out), err)
		}
		out = append(out, m)
	}
	return out
}

func TestWatchResources(t *testing.T) {
	t.Parallel()
	// A history of one change set: a resume from before it gets a snapshot.
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WatchHistory = 1 })
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	s, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{Prefix: "default/"})
	if err != nil {
		t.Fatal(err)
	}
	first := recvN(t, s, 2)
	if first[0].GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT || !first[0].GetFresh() ||
		len(first[0].GetChanges()) != 4 || first[0].GetRevision() != 1 {
		t.Fatalf("snapshot %v", first[0])
	}
	if first[1].GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED || first[1].GetRevision() != 1 {
		t.Fatalf("synced %v", first[1])
	}
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("x", "a", "b", "")}}); err != nil {
		t.Fatal(err)
	}
	// The history holds one change set: the stream reads the put before the
	// delete is made, or it has fallen behind (as it should).
	ch := recvN(t, s, 1)
	if _, err := h.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficPermission/x"}}); err != nil {
		t.Fatal(err)
	}
	ch = append(ch, recvN(t, s, 1)...)
	if ch[0].GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES || ch[0].GetRevision() != 2 ||
		ch[0].GetChanges()[0].GetResource().GetResource().GetPolicy().GetName() != "x" {
		t.Errorf("put %v", ch[0])
	}
	if ch[1].GetRevision() != 3 || !ch[1].GetChanges()[0].GetDeleted() {
		t.Errorf("delete %v", ch[1])
	}
	cancel()

	// The store's own history is gone: resumes are served from the server's.
	h.b.compact()

	// Resuming after revision 2 replays the delete alone, from the history.
	r, err := h.wat.WatchResources(ctxT(t), &verdictv1.WatchResourcesRequest{FromRevision: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m := recvN(t, r, 1)[0]; m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES || m.GetRevision() != 3 ||
		m.GetChanges()[0].GetKey() != "default/policies/TrafficPermission/x" || !m.GetChanges()[0].GetDeleted() {
		t.Errorf("resume: %v", m)
	}

	// Revision 1 is older than the history (one change set, revision 3): a
	// fresh snapshot of the state at 3, the prefix's part only.
	c, err := h.wat.WatchResources(ctxT(t), &verdictv1.WatchResourcesRequest{FromRevision: 1, Prefix: "prod/"})
	if err != nil {
		t.Fatal(err)
	}
	m := recvN(t, c, 2)
	if m[0].GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT || !m[0].GetFresh() || m[0].GetRevision() != 3 ||
		len(m[0].GetChanges()) != 2 || m[0].GetChanges()[0].GetKey() != "prod/policies/TrafficPermission/web-in-apps" ||
		m[1].GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED || m[1].GetRevision() != 3 {
		t.Errorf("resume from before the history: %v", m)
	}
}

// TestWatchResourcesDropsASlowStream: a stream that reads nothing while the
// history moves past it ends with RESOURCE_EXHAUSTED naming the revision to
// resume from, and is counted; the resume gets a fresh snapshot.
func TestWatchResourcesDropsASlowStream(t *testing.T) {
	t.Parallel()
	// A fixed 64 KiB stream window (no dynamic window): unread messages block
	// the server's Send once it is full.
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WatchHistory = 4 },
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx := ctxT(t)
	slow, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, slow, 2) // snapshot and SYNCED; nothing more is read until the writes are done
	conf, _ := structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", 16<<10)})
	const writes = 40 // 640 KiB of changes, ten times the window
	var last int64
	for i := range writes {
		p := sdPolicy(fmt.Sprintf("big-%d", i), "a", "b", "")
		p.GetPolicy().Conf = conf
		resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{p}})
		if err != nil {
			t.Fatal(err)
		}
		last = resp.GetRevision()
	}
	var resume int64 = 1
	for {
		m, err := slow.Recv()
		if err != nil {
			st := wantCode(t, err, codes.ResourceExhausted)
			want := fmt.Sprintf("fell behind; resume from revision %d", resume)
			if !strings.Contains(st.Message(), want) {
				t.Errorf("message %q, want %q", st.Message(), want)
			}
			break
		}
		if m.GetRevision() != resume+1 {
			t.Fatalf("change at %d after %d: a change set was skipped", m.GetRevision(), resume)
		}
		resume = m.GetRevision()
	}
	if resume >= last {
		t.Fatalf("the stream got every change (to %d): it never fell behind", resume)
	}
	if n := h.srv.feed.Dropped(); n != 1 {
		t.Errorf("%d streams counted as dropped, want 1", n)
	}
	for h.srv.feed.Revision() < last { // the feed follows the syncer
		if ctx.Err() != nil {
			t.Fatalf("the feed is at %d, never at %d", h.srv.feed.Revision(), last)
		}
		time.Sleep(time.Millisecond)
	}
	r, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{FromRevision: resume})
	if err != nil {
		t.Fatal(err)
	}
	m := recvN(t, r, 1)[0]
	if m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT || !m.GetFresh() || m.GetRevision() != last {
		t.Errorf("resume from %d: %v", resume, m.GetType())
	}
}

func TestWatchResourcesEndsOnShutdown(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	s, err := h.wat.WatchResources(ctxT(t), &verdictv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, s, 2)
	go h.stop()
	_, err = s.Recv()
	wantCode(t, err, codes.Unavailable)
}

func TestWatchRules(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	req := &verdictv1.WatchRulesRequest{Workload: tags("app", "backend")}
	s1, err := h.wat.WatchRules(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Mesh: "default", Type: "TrafficPermission", Workload: tags("app", "backend")})
	if err != nil {
		t.Fatal(err)
	}
	a, b := recvN(t, s1, 1)[0], recvN(t, s2, 1)[0]
	in := a.GetInbound().GetRules()
	if len(in) != 1 || in[0].GetPolicy() != "web-to-backend" || in[0].GetPeer()[0].GetMatch()["app"] != "web" ||
		in[0].GetPorts()[0].GetPorts() != "8080" || a.GetInbound().GetFallback() != verdictv1.Action_ACTION_DENY {
		t.Errorf("inbound %v", a.GetInbound())
	}
	if b.GetRevision() != a.GetRevision() || len(b.GetInbound().GetRules()) != 1 {
		t.Errorf("second stream %v", b)
	}
	if n := h.srv.hub.Stats().Groups; n != 1 {
		t.Errorf("%d groups for one workload", n)
	}

	// A change that does not concern the workload sends nothing; one that does, sends.
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("other", "x", "y", "")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("deny-api", "api", "backend", "DENY")}}); err != nil {
		t.Fatal(err)
	}
	c := recvN(t, s1, 1)[0]
	if c.GetRevision() != 3 || len(c.GetInbound().GetRules()) != 2 {
		t.Errorf("after the change: %v", c)
	}
	_, err = h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Mesh: "nope"})
	if err == nil {
		var s grpc.ServerStreamingClient[verdictv1.WatchRulesResponse]
		s, err = h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Mesh: "nope"})
		if err == nil {
			_, err = s.Recv()
		}
	}
	wantCode(t, err, codes.NotFound)
}

func TestWatchRulesGroupsAreShared(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx, cancel := context.WithCancel(ctxT(t))
	for i := range 6 { // the streams stay open until cancel
		app := []string{"web", "backend"}[i%2]
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("app", app, "env", "x")})
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, s, 1)
	}
	if n := h.srv.hub.Stats().Groups; n != 2 {
		t.Errorf("%d groups, want 2", n)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for h.srv.hub.Stats().Groups != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.srv.hub.Stats().Groups; n != 0 {
		t.Errorf("%d groups left after every stream ended", n)
	}
}

// TestStopSumsUpEndedStreams: streams the stop ends (UNAVAILABLE) are logged at
// debug and counted in one "stopped" line, not as a warning each.
func TestStopSumsUpEndedStreams(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Logger = log })
	const streams = 5
	var open []verdictv1.WatchService_WatchResourcesClient
	for range streams {
		s, err := h.wat.WatchResources(ctxT(t), &verdictv1.WatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, s, 2)
		open = append(open, s)
	}
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	for _, s := range open {
		_, err := s.Recv()
		wantCode(t, err, codes.Unavailable)
	}
	<-stopped
	var lines int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "finished call" && rec["level"] != "DEBUG" {
			t.Errorf("logged at %s: %s", rec["level"], line)
		}
		if rec["msg"] == "stopped" {
			lines++
			if rec["calls_ended_by_stop"] != float64(streams) {
				t.Errorf("stopped line %s, want calls_ended_by_stop %d", line, streams)
			}
		}
	}
	if lines != 1 {
		t.Errorf("%d stopped lines in\n%s", stopped, logs.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for the server's goroutines to log into.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

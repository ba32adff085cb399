package server

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// syncBuffer is a bytes.Buffer safe for the logger's goroutine and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSpace(b.buf.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// startLogged serves testPolicies with a decision log whose JSON lines go to
// the returned buffer.
func startLogged(t *testing.T, filter decisionlog.Filter, token string) (*harness, *syncBuffer) {
	t.Helper()
	buf := &syncBuffer{}
	l, err := decisionlog.New(decisionlog.Config{Filter: filter, FlushInterval: 10 * time.Millisecond, RepeatWindow: 50 * time.Millisecond,
		Sinks: []decisionlog.Sink{decisionlog.NewJSONLines(buf, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) {
		c.DecisionLog = l
		c.Token = token
	})
	return h, buf
}

func TestDecisionLogRecordsDecisions(t *testing.T) {
	h, buf := startLogged(t, decisionlog.Denies, "")
	c := ctxT(t)
	allow := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"), Protocol: "TCP", Port: 8080}
	deny := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db"), Protocol: "TCP", Port: 5432}
	for _, r := range []*verdictv1.DecideRequest{allow, deny} {
		if _, err := h.dec.Decide(c, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.dec.DecideBatch(c, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{allow, deny, deny}}); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for deadline := time.Now().Add(time.Minute); len(lines) < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		lines = buf.lines()
	}
	if len(lines) != 3 {
		t.Fatalf("%d records, want the 3 denies only (one as a repeat):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	r := parseRecord(t, lines[0])
	if r.Rpc != "Decide" || r.Action != "DENY" || r.Policy != "deny-db" || r.Mesh != "default" || r.Type != "TrafficPermission" ||
		r.Destination.Tags["app"] != "db" || r.Inbound.Reason != "MATCHED" || r.Caller.GetAddress() == "" || r.Revision == 0 || r.Port != 5432 {
		t.Errorf("record %v", r)
	}
	// The batch's second deny repeats its first: counted, written when the
	// repeat window closes.
	if r := parseRecord(t, lines[1]); r.Rpc != "DecideBatch" || r.Repeats != 0 {
		t.Errorf("second record from %q, repeats %d", r.Rpc, r.Repeats)
	}
	if r := parseRecord(t, lines[2]); r.Rpc != "DecideBatch" || r.Repeats != 1 {
		t.Errorf("third record from %q, repeats %d: want the batch's repeat", r.Rpc, r.Repeats)
	}
}

func TestFollowDecisions(t *testing.T) {
	h, _ := startLogged(t, decisionlog.All, "s3cret")
	c := ctxT(t)
	lc := verdictv1.NewDecisionLogServiceClient(h.conn)
	_, err := recvFirst(lc.Follow(c, &verdictv1.FollowRequest{}))
	wantCode(t, err, codes.Unauthenticated)

	authed := metadata.AppendToOutgoingContext(c, "authorization", "Bearer s3cret")
	stream, err := lc.Follow(authed, &verdictv1.FollowRequest{Action: "DENY", Workload: "db"})
	if err != nil {
		t.Fatal(err)
	}
	// The follower starts on the server when the stream does: decide until
	// the first matching record arrives.
	got := make(chan *verdictv1.DecisionRecord, 1)
	go func() {
		m, err := stream.Recv()
		if err == nil {
			got <- m.GetRecord()
		}
		close(got)
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, dst := range []string{"backend", "db"} {
			if _, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", dst),
				Protocol: "TCP", Port: 8080}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case r, ok := <-got:
			if !ok {
				t.Fatal("the follow stream ended")
			}
			if r.GetAction() != "DENY" || r.GetDestination().GetTags()["app"] != "db" || r.GetPolicy() != "deny-db" {
				t.Fatalf("followed %v", r)
			}
			return
		case <-tick.C:
		case <-c.Done():
			t.Fatal("no record followed")
		}
	}
}

func TestFollowWithTheLogOff(t *testing.T) {
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	_, err := recvFirst(verdictv1.NewDecisionLogServiceClient(h.conn).Follow(ctxT(t), &verdictv1.FollowRequest{}))
	wantCode(t, err, codes.FailedPrecondition)
}

func recvFirst(s interface {
	Recv() (*verdictv1.FollowResponse, error)
}, err error) (*verdictv1.FollowResponse, error) {
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// A Check is logged as the decision it is, under its own RPC name, with the
// endpoints as Envoy gave them (addresses here).
func TestDecisionLogRecordsChecks(t *testing.T) {
	h, buf := startLogged(t, decisionlog.All, "")
	req := envoyTCPCheck(plainConn, envoyFilter{labels: map[string]string{"app": "db"}})
	if _, err := authzClient(h).Check(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for deadline := time.Now().Add(time.Minute); len(lines) < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		lines = buf.lines()
	}
	if len(lines) != 1 {
		t.Fatalf("%d records, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	r := parseRecord(t, lines[0])
	if r.Rpc != "Check" || r.Source.Address != "10.0.0.1" || r.Destination.Tags["app"] != "db" || r.Port != 8080 || r.Protocol != "TCP" {
		t.Errorf("record %s", lines[0])
	}
}

// TestFollowSaysTheFilter: a Follow stream opens with the daemon's filter in
// a header, before any record, so that a follower waiting for records the
// daemon never logs can say why (verdictctl logs --audit-only).
func TestFollowSaysTheFilter(t *testing.T) {
	for _, f := range []decisionlog.Filter{decisionlog.All, decisionlog.Denies, decisionlog.AuditDiffs} {
		t.Run(f.String(), func(t *testing.T) {
			h, _ := startLogged(t, f, "")
			stream, err := verdictv1.NewDecisionLogServiceClient(h.conn).Follow(ctxT(t), &verdictv1.FollowRequest{AuditOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			md, err := stream.Header() // no decision is made: the header comes alone
			if err != nil {
				t.Fatal(err)
			}
			if got := md.Get(decisionlog.FilterHeader); len(got) != 1 || got[0] != f.String() {
				t.Errorf("header %s: %q, want %q", decisionlog.FilterHeader, got, f.String())
			}
		})
	}
}

// parseRecord reads one JSON line of the decision log: the proto3 JSON
// mapping of the record.
func parseRecord(t *testing.T, line string) *decisionlog.Record {
	t.Helper()
	r := &decisionlog.Record{}
	if err := protojson.Unmarshal([]byte(line), r); err != nil {
		t.Fatalf("a line of the decision log: %v\n%s", err, line)
	}
	return r
}

// TestFollowMatch: a follower's filters on decisions, and on the summaries
// of drops, which pass a mesh or type filter when they count that mesh.
func TestFollowMatch(t *testing.T) {
	t.Parallel()
	deny := &decisionlog.Record{Mesh: "a", Type: "TrafficPermission", Action: "DENY", Policy: "p"}
	summary := &decisionlog.Record{Dropped: []*verdictv1.RecordsDropped{{Mesh: "a", Reason: "queue full", Count: 3}}}
	tests := []struct {
		req     *verdictv1.FollowRequest
		rec     *decisionlog.Record
		matched bool
	}{
		{&verdictv1.FollowRequest{}, deny, true},
		{&verdictv1.FollowRequest{Mesh: "a"}, deny, true},
		{&verdictv1.FollowRequest{Mesh: "b"}, deny, false},
		{&verdictv1.FollowRequest{Action: "allow"}, deny, false},
		{&verdictv1.FollowRequest{Policy: "p"}, deny, true},
		{&verdictv1.FollowRequest{}, summary, true},
		{&verdictv1.FollowRequest{Mesh: "a"}, summary, true},
		{&verdictv1.FollowRequest{Mesh: "a", Type: "TrafficPermission"}, summary, true},
		{&verdictv1.FollowRequest{Mesh: "b"}, summary, false},
		{&verdictv1.FollowRequest{Action: "DENY"}, summary, false},
	}
	for i, tc := range tests {
		if got := followMatch(tc.req)(tc.rec); got != tc.matched {
			t.Errorf("%d: %v on %v: %v, want %v", i, tc.req, tc.rec, got, tc.matched)
		}
	}
}

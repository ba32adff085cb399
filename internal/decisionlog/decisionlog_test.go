package decisionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func record(i int, action string) *Record {
	return &Record{Time: timestamppb.New(time.Unix(1_700_000_000, int64(i))), Rpc: "Decide", Revision: int64(i), Mesh: "default",
		Type: "TrafficPermission", Action: action, Policy: "p",
		Source:      &verdictv1.RecordEndpoint{Tags: map[string]string{"app": "web"}},
		Destination: &verdictv1.RecordEndpoint{Address: "10.0.0.2"}, Protocol: "TCP", Port: 8080,
		Outbound: &verdictv1.RecordSide{Action: action, Policy: "p", Reason: "MATCHED"},
		Inbound:  &verdictv1.RecordSide{Action: action, Policy: "p", Reason: "MATCHED"},
		Caller:   &verdictv1.RecordCaller{Address: "127.0.0.1:5000"}}
}

// blockingSink holds every Write until release is closed.
type blockingSink struct {
	release chan struct{}
	mu      sync.Mutex
	got     int       // decision records
	dropped []*Record // summary records
}

func (s *blockingSink) Write(ctx context.Context, b []*Record) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	for _, r := range b {
		if r.Dropped != nil {
			s.dropped = append(s.dropped, r)
		} else {
			s.got++
		}
	}
	s.mu.Unlock()
	return nil
}
func (s *blockingSink) Close(context.Context) error { return nil }

func run(t *testing.T, l *Logger) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// A sink that does not keep up never blocks Log: the records beyond the
// queue are dropped and counted; every record offered is written or dropped.
func TestFullQueueDropsAndCounts(t *testing.T) {
	sink := &blockingSink{release: make(chan struct{})}
	l, err := New(Config{QueueSize: 100, BatchSize: 10, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, l)
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			l.Log(0, record(i, "ALLOW"))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Log blocked behind a sink that does not write")
	}
	st := l.Stats()
	if st.Offered != 1000 || st.Dropped < 1000-100-10 {
		t.Fatalf("stats %+v: want 1000 offered and at least %d dropped", st, 1000-100-10)
	}
	close(sink.release)
	stop()
	st = l.Stats()
	if st.Written+st.Dropped != 1000 || int64(sink.got) != st.Written {
		t.Fatalf("stats %+v, sink got %d: every record is written or dropped", st, sink.got)
	}
	// The drops are told in the log itself, per mesh and reason (here at
	// the stop: the summary interval is 10 s).
	if len(sink.dropped) != 1 || len(sink.dropped[0].Dropped) != 1 {
		t.Fatalf("summary records %v", sink.dropped)
	}
	if d := sink.dropped[0].Dropped[0]; d.Mesh != "default" || d.Reason != ReasonQueueFull || d.Count != st.Dropped {
		t.Errorf("summary %v, want %d dropped in default", d, st.Dropped)
	}
}

func TestFilterAndSample(t *testing.T) {
	for _, tc := range []struct {
		f                      Filter
		allow, deny, auditDiff bool
	}{
		{All, true, true, true},
		{Denies, false, true, false},
		{AuditDiffs, false, false, true},
	} {
		l, _ := New(Config{Filter: tc.f})
		if got := l.Wants(false, false); got != tc.allow {
			t.Errorf("%v: ALLOW wanted %v", tc.f, got)
		}
		if got := l.Wants(true, false); got != tc.deny {
			t.Errorf("%v: DENY wanted %v", tc.f, got)
		}
		if got := l.Wants(false, true); got != tc.auditDiff {
			t.Errorf("%v: audit difference wanted %v", tc.f, got)
		}
	}
	l, _ := New(Config{SampleRate: 0.1})
	n := 0
	for range 10_000 {
		if l.Wants(false, false) {
			n++
		}
	}
	if n < 500 || n > 1500 {
		t.Errorf("sample rate 0.1 kept %d of 10,000", n)
	}
	var nl *Logger
	if nl.Wants(true, true) {
		t.Error("a nil logger wants records")
	}
	if _, err := New(Config{SampleRate: 2}); err == nil {
		t.Error("sample rate 2 accepted")
	}
}

func TestJSONLines(t *testing.T) {
	var buf bytes.Buffer
	l, _ := New(Config{Sinks: []Sink{NewJSONLines(&buf, nil)}})
	stop := run(t, l)
	l.Log(0, record(1, "ALLOW"))
	l.Log(0, record(2, "DENY"))
	stop()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	var r Record
	if err := protojson.Unmarshal([]byte(lines[1]), &r); err != nil {
		t.Fatal(err)
	}
	if r.Action != "DENY" || r.Revision != 2 || r.Destination.Address != "10.0.0.2" || r.Inbound.Reason != "MATCHED" ||
		r.Caller.GetAddress() != "127.0.0.1:5000" {
		t.Errorf("line 2 read back as %v", &r)
	}
	// The proto3 JSON mapping: 64-bit integers are strings, the caller a
	// message of its own.
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &raw); err != nil {
		t.Fatal(err)
	}
	if raw["revision"] != "2" || raw["caller"].(map[string]any)["address"] != "127.0.0.1:5000" || raw["port"] != 8080.0 {
		t.Errorf("line 2: %s", lines[1])
	}
}

// collector is an OTLP logs receiver: the collector's gRPC service, served
// on loopback.
type collector struct {
	collogspb.UnimplementedLogsServiceServer
	mu   sync.Mutex
	reqs []*collogspb.ExportLogsServiceRequest
}

func (c *collector) Export(_ context.Context, r *collogspb.ExportLogsServiceRequest) (*collogspb.ExportLogsServiceResponse, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, r)
	c.mu.Unlock()
	return &collogspb.ExportLogsServiceResponse{}, nil
}

func (c *collector) records() map[string]string { // body → action attribute
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for _, r := range c.reqs {
		for _, rl := range r.GetResourceLogs() {
			for _, sl := range rl.GetScopeLogs() {
				for _, lr := range sl.GetLogRecords() {
					for _, a := range lr.GetAttributes() {
						if a.GetKey() == "verdict.revision" {
							out[lr.GetBody().GetStringValue()+" #"+strings.TrimSpace(a.GetValue().String())] = lr.GetEventName()
						}
					}
				}
			}
		}
	}
	return out
}

func TestOTLPSink(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	collogspb.RegisterLogsServiceServer(srv, col)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	exp, err := otlploggrpc.New(context.Background(), otlploggrpc.WithEndpoint(lis.Addr().String()), otlploggrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	l, _ := New(Config{Sinks: []Sink{NewOTLP(exp)}})
	stop := run(t, l)
	l.Log(0, record(7, "DENY"))
	l.Log(0, record(8, "ALLOW"))
	stop() // flushes and shuts the exporter down
	got := col.records()
	if len(got) != 2 {
		t.Fatalf("the collector received %v", got)
	}
	for body, event := range got {
		if event != "verdict.decision" || !strings.Contains(body, "default/TrafficPermission by policy p") {
			t.Errorf("record %q (event %q)", body, event)
		}
	}
}

type errSink struct{}

func (errSink) Write(context.Context, []*Record) error { return errors.New("disk full") }
func (errSink) Close(context.Context) error            { return nil }

func TestSinkErrorsAreCountedAndOthersStillWrite(t *testing.T) {
	var buf bytes.Buffer
	l, _ := New(Config{Sinks: []Sink{errSink{}, NewJSONLines(&buf, nil)}})
	stop := run(t, l)
	l.Log(0, record(1, "ALLOW"))
	stop()
	if st := l.Stats(); st.SinkErrors != 1 || st.Written != 1 || buf.Len() == 0 {
		t.Errorf("stats %+v, JSON %q", st, buf.String())
	}
}

func TestFollowers(t *testing.T) {
	l, _ := New(Config{BatchSize: 1})
	stop := run(t, l)
	denies := l.Follow(func(r *Record) bool { return r.Action == "DENY" }, 100)
	slow := l.Follow(nil, 2)
	for i := range 10 {
		l.Log(0, record(i, []string{"ALLOW", "DENY"}[i%2]))
	}
	for range 5 {
		select {
		case r := <-denies.Records():
			if r.Action != "DENY" {
				t.Errorf("the DENY follower got %s", r.Action)
			}
		case <-time.After(time.Minute):
			t.Fatal("the DENY follower got fewer than 5 records")
		}
	}
	select {
	case <-slow.Done():
		if !errors.Is(slow.Err(), ErrTooSlow) {
			t.Errorf("the slow follower ended with %v", slow.Err())
		}
	case <-time.After(time.Minute):
		t.Fatal("a follower that never reads was not dropped")
	}
	if st := l.Stats(); st.FollowersDropped != 1 {
		t.Errorf("stats %+v: one follower dropped", st)
	}
	l.Close(denies)
	if denies.Err() != nil {
		t.Errorf("closed follower: %v", denies.Err())
	}
	stop()
	after := l.Follow(nil, 1)
	<-after.Done()
	if !errors.Is(after.Err(), ErrStopped) {
		t.Errorf("a follower of a stopped logger: %v", after.Err())
	}
}

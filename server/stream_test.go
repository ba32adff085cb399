package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Stream tests that check for leaks run sequentially (no t.Parallel): goleak
// then sees only their own goroutines, checked while the server still runs —
// a handler parked until the server stops is a leak all the same.

// leakBaseline returns a check that every goroutine started since is gone
// (goleak retries while they wind down).
func leakBaseline(t *testing.T) func() {
	t.Helper()
	base := goleak.IgnoreCurrent()
	return func() {
		t.Helper()
		var err error
		for range 20 { // each Find retries for about half a second: 10 s in all on a busy machine
			if err = goleak.Find(base); err == nil {
				return
			}
		}
		t.Error(err)
	}
}

func TestDecideStreamEndsOnCancelInEveryState(t *testing.T) {
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WaitTimeout = time.Hour })
	if _, err := h.dec.Decide(ctxT(t), &verdictv1.DecideRequest{}); err != nil { // the connection is up
		t.Fatal(err)
	}
	flow := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db")}
	states := []struct {
		name string
		// run opens a stream on ctx, leaves it in a state and returns; the
		// stream is cancelled then.
		run func(t *testing.T, ctx context.Context)
	}{
		{"one message sent, no answer read", func(t *testing.T, ctx context.Context) {
			s, err := h.dec.DecideStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: flow}); err != nil {
				t.Fatal(err)
			}
		}},
		{"blocked on receive", func(t *testing.T, ctx context.Context) {
			s, err := h.dec.DecideStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: flow}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
		}},
		{"blocked on send (the client does not read)", func(t *testing.T, ctx context.Context) {
			s, err := h.dec.DecideStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			explained := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db"), Explain: true}
			for i := range 3000 { // far more answers than the flow-control windows hold
				if err := s.Send(&verdictv1.DecideStreamRequest{Id: "x", Request: explained}); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
		}},
		{"waiting for min_revision", func(t *testing.T, ctx context.Context) {
			s, err := h.dec.DecideStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ahead := &verdictv1.DecideRequest{MinRevision: 1 << 40}
			for range 3 {
				if err := s.Send(&verdictv1.DecideStreamRequest{Id: "w", Request: ahead}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: flow}); err != nil {
				t.Fatal(err)
			}
			if r, err := s.Recv(); err != nil || r.GetId() != "1" {
				t.Fatalf("answer %v, %v; want the message that does not wait", r, err)
			}
		}},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			check := leakBaseline(t)
			for range 50 {
				ctx, cancel := context.WithCancel(ctxT(t))
				st.run(t, ctx)
				cancel()
			}
			check()
		})
	}
	// The server still answers.
	if _, err := h.dec.Decide(ctxT(t), flow); err != nil {
		t.Fatal(err)
	}
}

func TestDecideStreamWaitHoldsNoOtherMessage(t *testing.T) {
	check := leakBaseline(t)
	defer check()
	b := newBackend(decodeYAML(t, testPolicies)...)
	h := start(t, b, func(c *Config) { c.WaitTimeout = time.Hour })
	defer h.stop()
	rev := b.Snapshot().Revision()
	s, err := h.dec.DecideStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	flow := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db")}
	send := func(id string, r *verdictv1.DecideRequest) {
		t.Helper()
		if err := s.Send(&verdictv1.DecideStreamRequest{Id: id, Request: r}); err != nil {
			t.Fatal(err)
		}
	}
	send("ahead", &verdictv1.DecideRequest{Source: flow.Source, Destination: flow.Destination, MinRevision: rev + 3})
	send("b", flow)
	send("c", flow)
	for _, want := range []string{"b", "c"} {
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetId() != want || r.GetResult().GetResponse().GetAction() != verdictv1.Action_ACTION_DENY {
			t.Fatalf("answer %v, want %q answered while \"ahead\" waits", r, want)
		}
	}
	for i := range 3 { // three writes (an unchanged document writes nothing): the snapshot reaches rev+3
		if _, err := h.pol.Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy(fmt.Sprint("p", i), "x", "y", "")}}); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetId() != "ahead" || r.GetResult().GetResponse().GetRevision() < rev+3 {
		t.Fatalf("answer %v, want \"ahead\" at revision %d or later", r, rev+3)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

func TestDecideStreamWaitTimesOutPerMessage(t *testing.T) {
	check := leakBaseline(t)
	defer check()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WaitTimeout = 50 * time.Millisecond })
	defer h.stop()
	s, err := h.dec.DecideStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ahead := &verdictv1.DecideRequest{MinRevision: 1 << 40}
	for range MaxStreamWaiting + 1 {
		if err := s.Send(&verdictv1.DecideStreamRequest{Id: "w", Request: ahead}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	// Every message gets its answer (the one over MaxStreamWaiting at once,
	// the others after their wait), then the stream ends cleanly.
	for i := range MaxStreamWaiting + 1 {
		r, err := s.Recv()
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if got := r.GetResult().GetError().GetCode(); got != codes.Unavailable.String() {
			t.Fatalf("answer %d: %v, want %s", i, r, codes.Unavailable)
		}
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

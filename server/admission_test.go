package server

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestAdmissionPerCaller: while another caller is present, a caller whose
// slots are all taken by its heavy calls (held here, as a flood's calls hold
// them while they run) queues its next calls, unary ones and stream messages alike, in admission; another
// caller's call is admitted and answered while the flood's queue waits; once
// the flood's slots free, its calls are answered in turn. Callers are told
// apart by their IP addresses (no certificates): each dials from its own
// loopback address.
func TestAdmissionPerCaller(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(decodeYAML(t, testPolicies)...)
	srv, err := New(Config{Syncer: b, Store: b, ShutdownTimeout: 2 * time.Second, AdmitPerCaller: 2})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, lis) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	from := func(ip string) verdictv1.DecisionServiceClient {
		local := &net.TCPAddr{IP: net.ParseIP(ip)}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{LocalAddr: local}).DialContext(ctx, "tcp", addr)
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return verdictv1.NewDecisionServiceClient(conn)
	}
	const flooder, honestIP = "127.0.0.2", "127.0.0.3"
	if c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(flooder)}}).Dial("tcp", lis.Addr().String()); err != nil {
		t.Skipf("no second loopback address to call from: %v", err)
	} else {
		c.Close()
	}
	flood, honest := from(flooder), from(honestIP)
	ctx := ctxT(t)
	flow := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"), Protocol: "TCP", Port: 8080}

	// The honest caller is present (one of its calls executes throughout):
	// a caller alone is not held to its share.
	if err := srv.slots.Acquire(ctx, honestIP); err != nil {
		t.Fatal(err)
	}
	defer srv.slots.Release(honestIP)
	// The flood's two slots are taken: its heavy calls run.
	for range 2 {
		if err := srv.slots.Acquire(ctx, flooder); err != nil {
			t.Fatal(err)
		}
	}
	// Its next calls wait: ten Decides, one DecideStream message, one
	// DecideCompactStream batch.
	type answer struct {
		what string
		err  error
	}
	answers := make(chan answer, 12)
	for range 10 {
		go func() {
			_, err := flood.Decide(ctx, flow)
			answers <- answer{"Decide", err}
		}()
	}
	st, err := flood.DecideStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: flow}); err != nil {
		t.Fatal(err)
	}
	go func() {
		m, err := st.Recv()
		if err == nil && m.GetResult().GetError() != nil {
			err = errors.New(m.GetResult().GetError().GetMessage())
		}
		answers <- answer{"DecideStream", err}
	}()
	cst, err := flood.DecideCompactStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cst.Send(&verdictv1.DecideCompactStreamRequest{Id: 1, Batch: &verdictv1.DecideCompactRequest{
		SourceIds: []uint64{1}, DestinationIds: []uint64{2}, PortProtocols: []uint32{8080 | 1<<16}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		m, err := cst.Recv()
		if err == nil && m.GetError() != nil {
			err = errors.New(m.GetError().GetMessage())
		}
		answers <- answer{"DecideCompactStream", err}
	}()
	waitUntil(t, "the flood's twelve calls queued", func() bool { return srv.slots.Waiting(flooder) == 12 })

	// The honest caller is not queued behind the flood.
	for range 3 {
		if _, err := honest.Decide(ctx, flow); err != nil {
			t.Fatalf("the honest caller's Decide: %v", err)
		}
	}
	if n := srv.slots.Waiting(flooder); n != 12 {
		t.Fatalf("the flood's calls waiting: %d, want all 12 still", n)
	}
	select {
	case a := <-answers:
		t.Fatalf("the flood's %s answered (%v) while its slots were taken", a.what, a.err)
	default:
	}

	// Its slots free: every waiting call is admitted and answered.
	srv.slots.Release(flooder)
	srv.slots.Release(flooder)
	for range 12 {
		if a := <-answers; a.err != nil {
			t.Errorf("the flood's %s: %v", a.what, a.err)
		}
	}
	if s := srv.slots.Stats(); s.Waited != 12 || s.Waiting != 0 {
		t.Errorf("admission %+v: want the 12 that waited admitted, none left waiting", s)
	}
}

// TestAdmittedRows: the decision methods are admitted per caller; the
// store's, the watches' and the analyses' are not.
func TestAdmittedRows(t *testing.T) {
	t.Parallel()
	var got []string
	for name, row := range methodTable {
		if row.admitted {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	want := []string{
		"/envoy.service.auth.v3.Authorization/Check",
		verdictv1.DecisionService_Decide_FullMethodName, verdictv1.DecisionService_DecideBatch_FullMethodName,
		verdictv1.DecisionService_DecideCompact_FullMethodName, verdictv1.DecisionService_DecideCompactStream_FullMethodName,
		verdictv1.DecisionService_DecideStream_FullMethodName, verdictv1.DecisionService_Identify_FullMethodName,
		verdictv1.DecisionService_Resolve_FullMethodName,
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("admitted rows %v, want %v", got, want)
	}
}

// waitUntil polls cond with a generous deadline: what it waits for happens,
// however busy the machine (no timing is asserted).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestPastReadsNotAdmitted: a read at a past revision or time waits for the
// store, not for a core, and is left out of admission; any other request is
// admitted.
func TestPastReadsNotAdmitted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		req  any
		past bool
	}{
		{"Decide", &verdictv1.DecideRequest{}, false},
		{"Decide at a revision", &verdictv1.DecideRequest{AtRevision: 3}, true},
		{"DecideBatch at a time", &verdictv1.DecideBatchRequest{AtTime: timestamppb.Now()}, true},
		{"Resolve with min_revision", &verdictv1.ResolveRequest{MinRevision: 3}, false},
		{"DecideCompact", &verdictv1.DecideCompactRequest{}, false},
		{"Check", &authv3.CheckRequest{}, false},
	} {
		if got := readsPast(tc.req); got != tc.past {
			t.Errorf("%s: reads the past %v, want %v", tc.name, got, tc.past)
		}
	}
}

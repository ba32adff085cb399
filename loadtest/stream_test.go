package loadtest

import (
	"net"
	"testing"
	"time"

	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// earlyDeadline answers a DecideStream like the empty handler, except that a
// stream carrying a deadline is ended with DEADLINE_EXCEEDED a little before
// it: the server's timer firing before the client's, as it does now and then
// on a loaded machine.
type earlyDeadline struct{ emptyDecisions }

func (e earlyDeadline) DecideStream(st verdictv1.DecisionService_DecideStreamServer) error {
	if dl, ok := st.Context().Deadline(); ok {
		go func() { _ = e.emptyDecisions.DecideStream(st) }()
		time.Sleep(time.Until(dl) - 100*time.Millisecond)
		return status.Error(codes.DeadlineExceeded, "the server's deadline")
	}
	return e.emptyDecisions.DecideStream(st)
}

// TestStreamTimeLimitIsNotAnError: the end of a Stream run is the client's
// decision; the server must not see it as a deadline of its own (found when
// the load tester's smoke test counted a DEADLINE_EXCEEDED at the end of a
// run as a failure of the target).
func TestStreamTimeLimitIsNotAnError(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	verdictv1.RegisterDecisionServiceServer(srv, earlyDeadline{newEmptyDecisions()})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	flows := []*verdictv1.DecideRequest{{Protocol: "TCP", Port: 80}}
	r := Stream(context.Background(), Conns{conn}, flows, 2, 4, Limits{Duration: 500 * time.Millisecond})
	if r.ErrorCount() > 0 || r.Count == 0 {
		t.Fatalf("%d answers, errors %v", r.Count, r.Errors)
	}
}

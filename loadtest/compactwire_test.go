package loadtest

import (
	"bytes"
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func testBatch(n int) *verdictv1.DecideCompactRequest {
	r := &verdictv1.DecideCompactRequest{Mesh: "default", Type: "TrafficPermission"}
	for i := range n {
		r.SourceIds = append(r.SourceIds, uint64(i)*0x9E3779B97F4A7C15)
		r.DestinationIds = append(r.DestinationIds, ^uint64(i))
		r.PortProtocols = append(r.PortProtocols, uint32(8000+i)|1<<16)
	}
	return r
}

// The bytes the compact scenarios send are protobuf-go's for the same
// messages, so the server (and the empty handler) receive what any client
// would send.
func TestCompactWireSendsTheMessagesBytes(t *testing.T) {
	batch := testBatch(100)
	enc, err := encodeBatches([]*verdictv1.DecideCompactRequest{batch})
	if err != nil {
		t.Fatal(err)
	}
	codec := newCompactCodec()
	want, _ := proto.Marshal(batch)
	got, err := codec.Marshal(&enc[0])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), want) {
		t.Fatal("a batch is not sent as its message's bytes")
	}
	var m streamMessage
	for _, id := range []uint64{0, 1, 300, 1 << 40} {
		m.set(id, enc[0].b)
		got, err := codec.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.Marshal(&verdictv1.DecideCompactStreamRequest{Id: id, Batch: batch})
		if !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("stream message %d: not the message's bytes", id)
		}
	}
}

// An answer is read as its words: counted, the first error code reported, a
// stream message's whole-batch error too; the rest (policies, revision,
// ids) is skipped.
func TestCompactWireReadsAnswers(t *testing.T) {
	codec := newCompactCodec()
	resp := &verdictv1.DecideCompactResponse{Answers: []uint32{1 | 1<<8, 2 | 2<<8, 3 << 3, 1 << 3}, Policies: []string{"a", "b"}, Revision: 42}
	read := func(m proto.Message, stream bool) answers {
		t.Helper()
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		a := answers{stream: stream}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := read(resp, false); a.n != 4 || a.err == nil || !strings.Contains(a.err.Error(), "flow 2: COMPACT_CODE_INVALID_PORT_PROTOCOL") {
		t.Errorf("batch: %d answers, %v", a.n, a.err)
	}
	resp.Answers = resp.Answers[:2]
	if a := read(&verdictv1.DecideCompactStreamResponse{Id: 7, Batch: resp}, true); a.n != 2 || a.err != nil {
		t.Errorf("stream message: %d answers, %v", a.n, a.err)
	}
	bad := &verdictv1.DecideCompactStreamResponse{Id: 8, Error: &verdictv1.Error{Code: "INVALID_ARGUMENT", Message: "batch.sourceIds"}}
	if a := read(bad, true); a.n != 0 || a.err == nil || !strings.Contains(a.err.Error(), "batch.sourceIds") {
		t.Errorf("stream error: %d answers, %v", a.n, a.err)
	}
}

// unknownFlows answers every compact flow UNKNOWN_SOURCE.
type unknownFlows struct{ emptyDecisions }

func (unknownFlows) DecideCompact(_ context.Context, req *verdictv1.DecideCompactRequest) (*verdictv1.DecideCompactResponse, error) {
	out := &verdictv1.DecideCompactResponse{Answers: make([]uint32, len(req.GetSourceIds()))}
	for i := range out.Answers {
		out.Answers[i] = uint32(verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE) << 3
	}
	return out, nil
}

// The compact scenarios count an answer's flows as decisions, and a flow
// answered with an error code as a failed call.
func TestCompactScenarios(t *testing.T) {
	serve := func(h verdictv1.DecisionServiceServer) Conns {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		verdictv1.RegisterDecisionServiceServer(srv, h)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return Conns{conn}
	}
	batches := []*verdictv1.DecideCompactRequest{testBatch(100), testBatch(100)}
	lim := Limits{Duration: 10 * time.Second, Requests: 20, Warmup: time.Nanosecond}
	ctx := context.Background()
	empty := serve(newEmptyDecisions())
	for _, r := range []*Report{Compact(ctx, empty, batches, 2, lim), CompactStream(ctx, empty, batches, 2, lim)} {
		if r.ErrorCount() != 0 || r.Count == 0 || math.Abs(r.DecisionsPerSec/r.RPS-100) > 1e-6 {
			t.Errorf("%s: %d calls, %.0f calls/s, %.0f decisions/s, errors %v", r.Scenario, r.Count, r.RPS, r.DecisionsPerSec, r.Errors)
		}
	}
	if r := Compact(ctx, serve(unknownFlows{newEmptyDecisions()}), batches, 2, lim); r.ErrorCount() == 0 {
		t.Errorf("flows answered UNKNOWN_SOURCE: no error counted (%d calls)", r.Count)
	}
}

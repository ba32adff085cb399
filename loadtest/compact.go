package loadtest

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// CompactBatches packs flows (of one mesh and type) into DecideCompactRequests
// of size flows each, by identity (resource.Identity: every party computes it
// alike), and returns them with the endpoints Identify must register first on
// the target (RegisterIdentities).
func CompactBatches(reqs []engine.Request, size int) (batches []*verdictv1.DecideCompactRequest, endpoints []*verdictv1.Endpoint) {
	seen := map[uint64]bool{}
	add := func(mesh string, tags resource.Tags) uint64 {
		id := resource.Identity(mesh, tags)
		if !seen[id] {
			seen[id] = true
			endpoints = append(endpoints, &verdictv1.Endpoint{Tags: tags})
		}
		return id
	}
	var cur *verdictv1.DecideCompactRequest
	for _, r := range reqs {
		if cur == nil || len(cur.SourceIds) == size {
			cur = &verdictv1.DecideCompactRequest{Mesh: r.Mesh, Type: r.Type}
			batches = append(batches, cur)
		}
		cur.SourceIds = append(cur.SourceIds, add(r.Mesh, r.Source))
		cur.DestinationIds = append(cur.DestinationIds, add(r.Mesh, r.Destination))
		cur.PortProtocols = append(cur.PortProtocols, r.Port|uint32(r.Protocol)<<16)
	}
	if len(batches) > 1 && len(batches[len(batches)-1].SourceIds) < size {
		batches = batches[:len(batches)-1] // every call carries size flows
	}
	return batches, endpoints
}

// RegisterIdentities registers endpoints (of mesh) with Identify, 1,000 per
// call. An endpoint refused by the server's per-caller registration limit
// (RESOURCE_EXHAUSTED: 10,000 at once, then 1,000 a second) is asked again
// a second later, with the ones after it.
func RegisterIdentities(ctx context.Context, conns Conns, mesh string, endpoints []*verdictv1.Endpoint) error {
	client := verdictv1.NewDecisionServiceClient(conns.pick(0))
	for i := 0; i < len(endpoints); {
		resp, err := client.Identify(ctx, &verdictv1.IdentifyRequest{Mesh: mesh, Endpoints: endpoints[i:min(i+1000, len(endpoints))]})
		if err != nil {
			return err
		}
		next := i + len(resp.GetResults())
		for j, r := range resp.GetResults() {
			e := r.GetError()
			if e == nil {
				continue
			}
			if e.GetCode() != codes.ResourceExhausted.String() {
				return fmt.Errorf("endpoints[%d]: %s: %s", i+j, e.GetCode(), e.GetMessage())
			}
			next = i + j
			select {
			case <-ctx.Done():
				return fmt.Errorf("endpoints[%d]: %s: %s", i+j, e.GetCode(), e.GetMessage())
			case <-time.After(time.Second):
			}
			break
		}
		i = next
	}
	return nil
}

// Compact runs DecideCompact, closed loop, concurrency workers; a call counts
// its flows as decisions, and a flow answered with an error code fails it.
// The batches are encoded once and read without building messages
// (compactwire.go).
func Compact(ctx context.Context, conns Conns, batches []*verdictv1.DecideCompactRequest, concurrency int, lim Limits) *Report {
	enc, encErr := encodeBatches(batches)
	codec := grpc.ForceCodecV2(newCompactCodec())
	got := make([]answers, concurrency)
	r := closedLoop(ctx, "compact", concurrency, lim, func(ctx context.Context, w int, i int64) (int, error) {
		if encErr != nil {
			return 0, encErr
		}
		b, a := &enc[i%int64(len(enc))], &got[w]
		if err := conns[w%len(conns)].Invoke(ctx, verdictv1.DecisionService_DecideCompact_FullMethodName, b, a, codec); err != nil {
			return 0, err
		}
		if a.err == nil && a.n != b.n {
			a.err = fmt.Errorf("%d answers to %d flows: %w", a.n, b.n, errShortAnswer)
		}
		return a.n, a.err
	})
	r.Mode += fmt.Sprintf(", %d flows per call", len(batches[0].GetSourceIds()))
	return r
}

// CompactStream runs DecideCompactStream: one stream per worker, one batch in
// flight on each; latency is per batch, from its send to its answer.
func CompactStream(ctx context.Context, conns Conns, batches []*verdictv1.DecideCompactRequest, streams int, lim Limits) *Report {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	enc, encErr := encodeBatches(batches)
	codec := grpc.ForceCodecV2(newCompactCodec())
	open := make([]grpc.ClientStream, streams)
	msgs := make([]streamMessage, streams)
	got := make([]answers, streams)
	r := closedLoop(ctx, "compact-stream", streams, lim, func(_ context.Context, w int, i int64) (int, error) {
		if encErr != nil {
			return 0, encErr
		}
		if open[w] == nil { // on the run's context: a call's own timeout must not end the stream
			st, err := verdictv1.NewDecisionServiceClient(conns.pick(w)).DecideCompactStream(sctx, codec)
			if err != nil {
				return 0, err
			}
			open[w] = st
		}
		b, m, a := &enc[i%int64(len(enc))], &msgs[w], &got[w]
		m.set(uint64(i), b.b)
		if err := open[w].SendMsg(m); err != nil {
			open[w] = nil
			return 0, err
		}
		a.stream = true
		if err := open[w].RecvMsg(a); err != nil {
			open[w] = nil
			return 0, err
		}
		if a.err == nil && a.n != b.n {
			a.err = fmt.Errorf("%d answers to %d flows: %w", a.n, b.n, errShortAnswer)
		}
		return a.n, a.err
	})
	for _, st := range open {
		if st != nil {
			_ = st.CloseSend()
		}
	}
	r.Mode = fmt.Sprintf("%d streams, %d flows per message", streams, len(batches[0].GetSourceIds()))
	return r
}

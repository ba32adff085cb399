package loadtest

import (
	"context"
	"fmt"

	"github.com/verdictpdp/verdict/engine"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// CompactBatches packs flows (of one mesh and type) into DecideCompactRequests
// of size flows each, by identity (engine.Identity: every party computes it
// alike), and returns them with the endpoints Identify must register first on
// the target (RegisterIdentities).
func CompactBatches(reqs []engine.Request, size int) (batches []*verdictv1.DecideCompactRequest, endpoints []*verdictv1.Endpoint) {
	seen := map[uint64]bool{}
	add := func(mesh string, tags engine.Tags) uint64 {
		id := engine.Identity(mesh, tags)
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
// call.
func RegisterIdentities(ctx context.Context, conns Conns, mesh string, endpoints []*verdictv1.Endpoint) error {
	client := verdictv1.NewDecisionServiceClient(conns.pick(0))
	for i := 0; i < len(endpoints); i += 1000 {
		resp, err := client.Identify(ctx, &verdictv1.IdentifyRequest{Mesh: mesh, Endpoints: endpoints[i:min(i+1000, len(endpoints))]})
		if err != nil {
			return err
		}
		for j, r := range resp.GetResults() {
			if e := r.GetError(); e != nil {
				return fmt.Errorf("endpoints[%d]: %s: %s", i+j, e.GetCode(), e.GetMessage())
			}
		}
	}
	return nil
}

// compactErr is the first per-flow error code of a compact answer, as an error.
func compactErr(resp *verdictv1.DecideCompactResponse) error {
	for i, a := range resp.GetAnswers() {
		if code := a >> 3 & 15; code != 0 {
			return fmt.Errorf("flow %d: %s", i, verdictv1.CompactCode(code))
		}
	}
	return nil
}

// Compact runs DecideCompact, closed loop, concurrency workers; a call counts
// its flows as decisions, and a flow answered with an error code fails it.
func Compact(ctx context.Context, conns Conns, batches []*verdictv1.DecideCompactRequest, concurrency int, lim Limits) *Report {
	clients := make([]verdictv1.DecisionServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = verdictv1.NewDecisionServiceClient(c)
	}
	r := closedLoop(ctx, "compact", concurrency, lim, func(ctx context.Context, w int, i int64) (int, error) {
		resp, err := clients[w%len(clients)].DecideCompact(ctx, batches[i%int64(len(batches))])
		if err != nil {
			return 0, err
		}
		return len(resp.GetAnswers()), compactErr(resp)
	})
	r.Mode += fmt.Sprintf(", %d flows per call", len(batches[0].GetSourceIds()))
	return r
}

// CompactStream runs DecideCompactStream: one stream per worker, one batch in
// flight on each; latency is per batch, from its send to its answer.
func CompactStream(ctx context.Context, conns Conns, batches []*verdictv1.DecideCompactRequest, streams int, lim Limits) *Report {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	open := make([]verdictv1.DecisionService_DecideCompactStreamClient, streams)
	r := closedLoop(ctx, "compact-stream", streams, lim, func(_ context.Context, w int, i int64) (int, error) {
		if open[w] == nil { // on the run's context: a call's own timeout must not end the stream
			st, err := verdictv1.NewDecisionServiceClient(conns.pick(w)).DecideCompactStream(sctx)
			if err != nil {
				return 0, err
			}
			open[w] = st
		}
		if err := open[w].Send(&verdictv1.DecideCompactStreamRequest{Id: uint64(i), Batch: batches[i%int64(len(batches))]}); err != nil {
			open[w] = nil
			return 0, err
		}
		m, err := open[w].Recv()
		if err != nil {
			open[w] = nil
			return 0, err
		}
		if e := m.GetError(); e != nil {
			return 0, fmt.Errorf("%s: %s", e.GetCode(), e.GetMessage())
		}
		return len(m.GetBatch().GetAnswers()), compactErr(m.GetBatch())
	})
	for _, st := range open {
		if st != nil {
			_ = st.CloseSend()
		}
	}
	r.Mode = fmt.Sprintf("%d streams, %d flows per message", streams, len(batches[0].GetSourceIds()))
	return r
}

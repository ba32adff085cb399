package server

import (
	"context"
	"testing"

	"github.com/verdictpdp/verdict/engine/policygen"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestCompactAllocatesPerBatchNotPerFlow: once its flows are in the memo, a
// batch of 1000 flows into a reused response allocates a few objects for the
// batch, none per flow: no tag map, no flow, no answer message, no metric
// option (the per-policy counters pass a kept slice).
func TestCompactAllocatesPerBatchNotPerFlow(t *testing.T) {
	set := policygen.Generate(policygen.Config{Seed: 3, Policies: 300})
	be := newBackend()
	applyAll(t, be, set.Resources)
	h := start(t, be, nil)
	ctx := context.Background()
	snap := be.Snapshot()
	req := &verdictv1.DecideCompactRequest{}
	for _, f := range set.Flows(3, 1000) {
		src, err := snap.Identify("", f.Source, h.srv.identities)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := snap.Identify("", f.Destination, h.srv.identities)
		if err != nil {
			t.Fatal(err)
		}
		req.SourceIds = append(req.SourceIds, src.Identity())
		req.DestinationIds = append(req.DestinationIds, dst.Identity())
		req.PortProtocols = append(req.PortProtocols, f.Port|uint32(f.Protocol)<<16)
	}
	out := &verdictv1.DecideCompactResponse{}
	for i := 0; i < 3; i++ { // into the memo (a flow is stored when seen twice)
		if err := h.srv.decision.decideCompact(ctx, snap, req, out); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := h.srv.decision.decideCompact(ctx, snap, req, out); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations per batch of %d flows, %d deciding policies", allocs, len(req.SourceIds), len(out.Policies))
	if limit := 16.0; allocs > limit {
		t.Errorf("%.0f allocations per batch of %d flows (%d deciding policies): want at most %.0f, none per flow",
			allocs, len(req.SourceIds), len(out.Policies), limit)
	}
}

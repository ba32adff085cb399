package server

import (
	"context"
	"testing"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestDecideBatchAllocatesAnswersTogether: once its tag-form flows are in the
// memo, a batch of 1000 allocates a few objects for the batch, none per flow:
// its answers' messages come in one slice, the decision counter's option is
// passed as a kept slice. Each answer still reports how its ends resolved,
// with their identities.
func TestDecideBatchAllocatesAnswersTogether(t *testing.T) {
	set := policygen.Generate(policygen.Config{Seed: 3, Policies: 300})
	be := newBackend()
	applyAll(t, be, set.Resources)
	h := start(t, be, nil)
	ctx := context.Background()
	req := &verdictv1.DecideBatchRequest{}
	for _, f := range set.Flows(3, MaxBatch) {
		req.Requests = append(req.Requests, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: f.Source},
			Destination: &verdictv1.Endpoint{Tags: f.Destination}, Protocol: f.Protocol.String(), Port: f.Port})
	}
	for i := 0; i < 3; i++ { // into the memo (a flow is stored when seen twice)
		resp, err := h.srv.decision.DecideBatch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for j, r := range resp.GetResults() {
			f := req.Requests[j]
			src, dst := r.GetResponse().GetSourceResolution(), r.GetResponse().GetDestinationResolution()
			if src.GetForm() != verdictv1.EndpointForm_ENDPOINT_FORM_TAGS || src.GetResolvedAs() != verdictv1.ResolvedAs_RESOLVED_AS_TAGS ||
				src.GetIdentity() != resource.Identity("", f.Source.Tags) || dst.GetIdentity() != resource.Identity("", f.Destination.Tags) {
				t.Fatalf("pass %d, flow %d: resolutions %v / %v", i, j, src, dst)
			}
		}
	}
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := h.srv.decision.DecideBatch(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations per batch of %d flows", allocs, len(req.Requests))
	if limit := 16.0; allocs > limit {
		t.Errorf("%.0f allocations per batch of %d flows: want at most %.0f, none per flow", allocs, len(req.Requests), limit)
	}
}

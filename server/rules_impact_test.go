package server

import (
	"fmt"
	"slices"
	"testing"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestPolicyWriteComputesOnlyTheGroupsItCanChange: with 20 workloads
// watched, a write of a policy that selects one of them computes that
// workload's rules again and no other's (each write computed every group of
// the mesh: 21-33 s of CPU per 20 s of writes with 2,000 streams); a write
// that concerns every workload computes every group; the streams get what
// changed and only that.
func TestPolicyWriteComputesOnlyTheGroupsItCanChange(t *testing.T) {
	t.Parallel()
	const watched = 20
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	streams := make([]rulesStream, watched)
	for i := range streams {
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("app", fmt.Sprintf("svc-%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, s, 1)
		streams[i] = s
	}
	tests := []struct {
		name    string
		policy  *verdictv1.Resource
		want    int   // groups computed again
		changed []int // the streams sent new rules
	}{
		{"a policy to one workload", sdPolicy("to-7", "peer", "svc-7", ""), 1, []int{7}},
		{"its action flipped", sdPolicy("to-7", "peer", "svc-7", "DENY"), 1, []int{7}},
		{"moved to another workload", sdPolicy("to-7", "svc-3", "peer", ""), 2, []int{3, 7}},
		{"a policy of workloads nobody watches", sdPolicy("elsewhere", "peer", "nobody", ""), 0, nil},
		{"a policy from every workload", sdPolicy("from-all", "*", "peer", ""), watched, nil},
	}
	for _, tc := range tests {
		before := h.srv.hub.Stats().Computed
		h.apply(t, ctx, tc.policy)
		rev := h.b.Snapshot().Revision()
		for h.srv.hub.Stats().Revision < rev { // the hub follows the syncer
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			time.Sleep(time.Millisecond)
		}
		if got := h.srv.hub.Stats().Computed - before; got != tc.want {
			t.Errorf("%s: %d groups computed again, want %d", tc.name, got, tc.want)
		}
		for _, i := range tc.changed {
			if m := recvN(t, streams[i], 1)[0]; m.GetRevision() != rev {
				t.Errorf("%s: svc-%d sent revision %d, want %d", tc.name, i, m.GetRevision(), rev)
			}
		}
	}
	// "from-all" added an outbound rule to every workload.
	for i, s := range streams {
		m := recvN(t, s, 1)[0]
		if !slices.ContainsFunc(m.GetOutbound().GetRules(), func(r *verdictv1.Rule) bool { return r.GetPolicy() == "from-all" }) {
			t.Errorf("svc-%d: %v", i, m.GetOutbound())
		}
	}
}

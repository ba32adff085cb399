package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestUnknownTypeNotFound: Decide, Resolve and WatchRules of a type the mesh
// does not know are NOT_FOUND naming the nearest known type (issue 18: a typo
// answered ALLOW UNENFORCED).
func TestUnknownTypeNotFound(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	src, dst := tags("app", "web"), tags("app", "backend")
	checks := map[string]error{}
	_, checks["Decide"] = h.dec.Decide(ctx, &verdictv1.DecideRequest{Type: "TraficPermission", Source: src, Destination: dst})
	_, checks["Resolve"] = h.dec.Resolve(ctx, &verdictv1.ResolveRequest{Type: "TrafficLgo", Source: src, Destination: dst})
	rs, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Type: "TraficPermission", Workload: dst})
	if err != nil {
		t.Fatal(err)
	}
	_, checks["WatchRules"] = rs.Recv()
	want := map[string]string{"Decide": "did you mean TrafficPermission?", "Resolve": "did you mean TrafficLog?", "WatchRules": "did you mean TrafficPermission?"}
	for call, err := range checks {
		st := wantCode(t, err, codes.NotFound)
		if !strings.Contains(st.Message(), want[call]) {
			t.Errorf("%s: %q does not say %q", call, st.Message(), want[call])
		}
	}
	// The known type still answers.
	if _, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Type: "TrafficPermission", Source: src, Destination: dst}); err != nil {
		t.Fatal(err)
	}
}

// TestApplyTypeWarnings: a policy of a type neither built in nor declared is
// written with a warning, and refused by a Mesh with strictTypes.
func TestApplyTypeWarnings(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	typo := sdPolicy("typo", "a", "b", "")
	typo.GetPolicy().Type = "TrafficPermision"
	for _, dry := range []bool{true, false} {
		resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{typo}, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if w := resp.GetWarnings(); len(w) != 1 || !strings.Contains(w[0], "did you mean TrafficPermission?") {
			t.Fatalf("dry run %v: warnings %q", dry, w)
		}
	}
	resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("fine", "a", "b", "")}})
	if err != nil || len(resp.GetWarnings()) != 0 {
		t.Fatalf("a built-in type: %v, warnings %q", err, resp.GetWarnings())
	}
	strict := decodeYAML(t, "kind: Mesh\nname: default\nstrictTypes: true\n")[0]
	mesh, err := apiconv.ResourceToProto(strict)
	if err != nil {
		t.Fatal(err)
	}
	typo.GetPolicy().Name = "typo2"
	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{mesh, typo}})
	if _, ok := violations(wantCode(t, err, codes.InvalidArgument))["resources[1].type"]; !ok {
		t.Errorf("strictTypes: %v", err)
	}
}

package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestControlCharactersRefused: {app: "web\0env\0prod"} hashes like {app:
// web, env: prod} under the identity's encoding; control characters are
// refused in tags at Identify, Decide and Apply, so the two never meet.
func TestControlCharactersRefused(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	honest, forged := tags("app", "web", "env", "prod"), tags("app", "web\x00env\x00prod")

	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{honest, forged}})
	if err != nil {
		t.Fatal(err)
	}
	if r := ids.GetResults()[0]; r.GetError() != nil || r.GetIdentity() == 0 {
		t.Fatalf("the honest set: %v", r)
	}
	if e := ids.GetResults()[1].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) == 0 ||
		!strings.Contains(e.GetFieldViolations()[0].GetDescription(), "control character") {
		t.Fatalf("the forged set was not refused: %v", ids.GetResults()[1])
	}

	batch, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{
		{Source: forged, Destination: tags("app", "db")}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := batch.GetResults()[0].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) == 0 ||
		!strings.Contains(e.GetFieldViolations()[0].GetDescription(), "control character") {
		t.Errorf("DecideBatch answered the forged set: %v", batch.GetResults()[0])
	}

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Decide source", func() error {
			_, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: forged, Destination: tags("app", "db")})
			return err
		}},
		{"Decide destination key", func() error {
			_, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: honest, Destination: tags("app\x7f", "db")})
			return err
		}},
		{"Apply workload", func() error {
			_, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{{Resource: &verdictv1.Resource_Workload{
				Workload: &verdictv1.Workload{Name: "w", Tags: forged.GetTags()}}}}})
			return err
		}},
		{"Apply policy selector", func() error {
			_, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web\x00env", "db", "ALLOW")}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := wantCode(t, tc.call(), codes.InvalidArgument)
			found := false
			for _, why := range violations(st) {
				found = found || strings.Contains(why, "control character")
			}
			if !found {
				t.Errorf("no violation names the control character: %v", st.Details())
			}
		})
	}
}

package server

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// An in-process call is judged by the method table as a call from the
// network is: open methods answer anyone (redacted), explain and
// PolicyService need the token, oversized requests are refused by their row.
func TestInProcessGoesThroughTheMethodTable(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies+testWorkloads)...)
	h := start(t, b, func(c *Config) { c.Token = "s3cret" })
	conn, err := h.srv.InProcess("explorer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	dec, pol := verdictv1.NewDecisionServiceClient(conn), verdictv1.NewPolicyServiceClient(conn)
	token := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	}
	flow := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "10.0.0.1"},
		Destination: &verdictv1.Endpoint{Workload: "backend-1"}, Protocol: "TCP", Port: 8080}
	explained := &verdictv1.DecideRequest{Source: flow.Source, Destination: flow.Destination, Protocol: "TCP", Port: 8080, Explain: true}
	oversized := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: map[string]string{strings.Repeat("k", 400): "v"}},
		Destination: flow.Destination}

	tests := []struct {
		name  string
		ctx   context.Context
		call  func(ctx context.Context) error
		code  codes.Code
		names bool // the answer names workloads
	}{
		{"plain decide, anonymous", ctxT(t), decideNames(t, dec, flow, false), codes.OK, false},
		{"plain decide, token", token(ctxT(t)), decideNames(t, dec, flow, true), codes.OK, true},
		{"explain, anonymous", ctxT(t), decideNames(t, dec, explained, false), codes.Unauthenticated, false},
		{"explain, token", token(ctxT(t)), decideNames(t, dec, explained, true), codes.OK, true},
		{"status, anonymous", ctxT(t), func(ctx context.Context) error {
			_, err := pol.Status(ctx, &verdictv1.StatusRequest{})
			return err
		}, codes.Unauthenticated, false},
		{"status, token", token(ctxT(t)), func(ctx context.Context) error {
			_, err := pol.Status(ctx, &verdictv1.StatusRequest{})
			return err
		}, codes.OK, false},
		{"invalid tag key", token(ctxT(t)), func(ctx context.Context) error {
			_, err := dec.Decide(ctx, oversized)
			return err
		}, codes.InvalidArgument, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(tc.ctx), tc.code)
		})
	}

	// Once the server stops, in-process calls fail.
	h.stop()
	_, err = dec.Decide(ctxT(t), flow)
	wantCode(t, err, codes.Unavailable)
}

// decideNames is a call of Decide that checks whether the answer names the
// workloads (when it answers).
func decideNames(t *testing.T, dec verdictv1.DecisionServiceClient, req *verdictv1.DecideRequest, names bool) func(context.Context) error {
	return func(ctx context.Context) error {
		resp, err := dec.Decide(ctx, req)
		if err == nil {
			wantNames(t, "Decide", resp.GetSourceResolution(), "web-1", names)
		}
		return err
	}
}

package server

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// emptyDecision answers Decide with a fixed response: the baseline of
// BenchmarkDecide, under the same server options.
type emptyDecision struct {
	verdictv1.UnimplementedDecisionServiceServer
	resp *verdictv1.DecideResponse
}

func (e emptyDecision) Decide(context.Context, *verdictv1.DecideRequest) (*verdictv1.DecideResponse, error) {
	return e.resp, nil
}

// BenchmarkDecide compares unary Decide with an empty handler registered on a
// server built with the same options (interceptors, stats handler, limits),
// over bufconn, with parallel clients. The target: Decide ≥ 80% of empty.
func BenchmarkDecide(b *testing.B) {
	var resources = `kind: Policy
name: log-all
type: TrafficLog
sources: [{match: {app: '*'}}]
destinations: [{match: {app: '*'}}]
conf: {backend: splunk, sample: 0.5, fields: [a, b, c]}
`
	for i := range 100 {
		resources += fmt.Sprintf("---\nkind: Policy\nname: p%d\nsources: [{match: {app: s%d}}]\ndestinations: [{match: {app: d%d}}]\n", i, i, i)
	}
	be := newBackend(decodeYAML(b, resources)...)
	req := &verdictv1.DecideRequest{Type: "TrafficLog", Source: tags("app", "s7", "env", "prod", "ip", "10.1.1.10"),
		Destination: tags("app", "d7", "env", "prod"), Protocol: "TCP", Port: 443}
	run := func(b *testing.B, client verdictv1.DecisionServiceClient) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if _, err := client.Decide(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("Decide", func(b *testing.B) {
		h := start(b, be, nil)
		run(b, h.dec)
	})
	b.Run("Empty", func(b *testing.B) {
		h := start(b, be, nil)
		resp, err := h.dec.Decide(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(h.srv.ServerOptions()...)
		verdictv1.RegisterDecisionServiceServer(srv, emptyDecision{resp: resp})
		h2 := serveRaw(b, srv)
		run(b, verdictv1.NewDecisionServiceClient(h2))
	})
}

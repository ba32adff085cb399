package server

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine/policygen"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
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

func (e emptyDecision) DecideBatch(_ context.Context, req *verdictv1.DecideBatchRequest) (*verdictv1.DecideBatchResponse, error) {
	out := &verdictv1.DecideBatchResponse{Results: make([]*verdictv1.DecideResult, len(req.Requests))}
	r := &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Response{Response: e.resp}}
	for i := range out.Results {
		out.Results[i] = r
	}
	return out, nil
}

// BenchmarkDecideBatch compares DecideBatch (100 generated flows per call, on a
// generated 1k-policy set) with an empty batch handler under the same options.
// It reports decisions/s; the client runs in the same process.
func BenchmarkDecideBatch(b *testing.B) {
	set := policygen.Generate(policygen.Config{Seed: 1, Policies: 1000})
	be := newBackend()
	for i := 0; i < len(set.Resources); i += store.MaxOps {
		ops := []store.Op{}
		for _, r := range set.Resources[i:min(i+store.MaxOps, len(set.Resources))] {
			ops = append(ops, store.Op{Key: r.Key(), Resource: r})
		}
		if _, err := be.Apply(context.Background(), ops); err != nil {
			b.Fatal(err)
		}
	}
	flows := set.Flows(2, 100)
	req := &verdictv1.DecideBatchRequest{}
	for _, f := range flows {
		req.Requests = append(req.Requests, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: f.Source},
			Destination: &verdictv1.Endpoint{Tags: f.Destination}, Protocol: f.Protocol.String(), Port: f.Port})
	}
	run := func(b *testing.B, client verdictv1.DecisionServiceClient) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if _, err := client.DecideBatch(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N*len(req.Requests))/b.Elapsed().Seconds(), "decisions/s")
	}
	b.Run("DecideBatch", func(b *testing.B) {
		h := start(b, be, nil)
		run(b, h.dec)
	})
	b.Run("Empty", func(b *testing.B) {
		h := start(b, be, nil)
		one, err := h.dec.Decide(context.Background(), req.Requests[0])
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(h.srv.ServerOptions()...)
		verdictv1.RegisterDecisionServiceServer(srv, emptyDecision{resp: one})
		run(b, verdictv1.NewDecisionServiceClient(serveRaw(b, srv)))
	})
}

package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// emptyCompact answers the compact RPCs with a fixed response of the right
// length: the baseline of BenchmarkDecideCompact, receiving the same bytes
// under the same server options.
type emptyCompact struct {
	verdictv1.UnimplementedDecisionServiceServer
	resp *verdictv1.DecideCompactResponse
}

func (e emptyCompact) DecideCompact(context.Context, *verdictv1.DecideCompactRequest) (*verdictv1.DecideCompactResponse, error) {
	return e.resp, nil
}

func (e emptyCompact) DecideCompactStream(stream verdictv1.DecisionService_DecideCompactStreamServer) error {
	out := &verdictv1.DecideCompactStreamResponse{Batch: e.resp}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		out.Id = m.GetId()
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// BenchmarkDecideCompact (issue 13 item 4): DecideCompact and
// DecideCompactStream with batches of 100 and 1000 flows between registered
// identities of a generated 1k-policy set, each beside an empty handler
// receiving the same bytes under the same options, in the same run. It reports
// decisions/s; the clients (parallel unary calls; one stream per parallel
// worker, a batch in flight each) run in the same process.
//
//	go test -run '^$' -bench BenchmarkDecideCompact -benchmem ./server/
func BenchmarkDecideCompact(b *testing.B) {
	set := policygen.Generate(policygen.Config{Seed: 1, Policies: 1000})
	be := newBackend()
	applyAll(b, be, set.Resources)
	for _, n := range []int{100, 1000} {
		h := start(b, be, nil)
		ctx := context.Background()
		flows := set.Flows(2, n)
		var eps []*verdictv1.Endpoint
		for _, f := range flows {
			eps = append(eps, &verdictv1.Endpoint{Tags: f.Source}, &verdictv1.Endpoint{Tags: f.Destination})
		}
		var ids []*verdictv1.Identified
		for i := 0; i < len(eps); i += MaxBatch {
			r, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps[i:min(i+MaxBatch, len(eps))]})
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, r.GetResults()...)
		}
		req := &verdictv1.DecideCompactRequest{}
		for i, f := range flows {
			req.SourceIds = append(req.SourceIds, ids[2*i].GetIdentity())
			req.DestinationIds = append(req.DestinationIds, ids[2*i+1].GetIdentity())
			req.PortProtocols = append(req.PortProtocols, f.Port|uint32(f.Protocol)<<16)
		}
		resp, err := h.dec.DecideCompact(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(h.srv.ServerOptions()...)
		verdictv1.RegisterDecisionServiceServer(srv, emptyCompact{resp: resp})
		empty := verdictv1.NewDecisionServiceClient(serveRaw(b, srv))
		unary := func(b *testing.B, client verdictv1.DecisionServiceClient) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := client.DecideCompact(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "decisions/s")
		}
		stream := func(b *testing.B, client verdictv1.DecisionServiceClient) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				st, err := client.DecideCompactStream(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				m := &verdictv1.DecideCompactStreamRequest{Batch: req}
				for pb.Next() {
					m.Id++
					if err := st.Send(m); err != nil {
						b.Error(err)
						return
					}
					if _, err := st.Recv(); err != nil {
						b.Error(err)
						return
					}
				}
				_ = st.CloseSend()
			})
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "decisions/s")
		}
		b.Run(fmt.Sprintf("batch=%d/DecideCompact", n), func(b *testing.B) { unary(b, h.dec) })
		b.Run(fmt.Sprintf("batch=%d/Empty", n), func(b *testing.B) { unary(b, empty) })
		b.Run(fmt.Sprintf("batch=%d/DecideCompactStream", n), func(b *testing.B) { stream(b, h.dec) })
		b.Run(fmt.Sprintf("batch=%d/EmptyStream", n), func(b *testing.B) { stream(b, empty) })
	}
}

// BenchmarkObserved measures what the observed-flows table costs, in one
// run: the same server with the table off and on, on the compact stream
// (batches of 1,000 flows between registered identities of a 1k-policy set:
// decisions/s) and on unary Decide (the process's CPU per call). -count
// alternates off and on; compare the medians.
//
//	go test -run '^$' -bench BenchmarkObserved -count 8 ./server/
func BenchmarkObserved(b *testing.B) {
	set := policygen.Generate(policygen.Config{Seed: 1, Policies: 1000})
	be := newBackend()
	applyAll(b, be, set.Resources)
	flows := set.Flows(2, 1000)
	for _, table := range []struct {
		name  string
		flows int
	}{{"off", -1}, {"on", 0}} {
		h := start(b, be, func(c *Config) { c.ObservedFlows = table.flows })
		ctx := context.Background()
		var eps []*verdictv1.Endpoint
		for _, f := range flows {
			eps = append(eps, &verdictv1.Endpoint{Tags: f.Source}, &verdictv1.Endpoint{Tags: f.Destination})
		}
		req := &verdictv1.DecideCompactRequest{}
		for i := 0; i < len(eps); i += MaxBatch {
			r, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps[i:min(i+MaxBatch, len(eps))]})
			if err != nil {
				b.Fatal(err)
			}
			for j := 0; j+1 < len(r.GetResults()); j += 2 {
				f := flows[(i+j)/2]
				req.SourceIds = append(req.SourceIds, r.GetResults()[j].GetIdentity())
				req.DestinationIds = append(req.DestinationIds, r.GetResults()[j+1].GetIdentity())
				req.PortProtocols = append(req.PortProtocols, f.Port|uint32(f.Protocol)<<16)
			}
		}
		b.Run("compact-stream/"+table.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				st, err := h.dec.DecideCompactStream(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				m := &verdictv1.DecideCompactStreamRequest{Batch: req}
				for pb.Next() {
					m.Id++
					if err := st.Send(m); err != nil {
						b.Error(err)
						return
					}
					if _, err := st.Recv(); err != nil {
						b.Error(err)
						return
					}
				}
				_ = st.CloseSend()
			})
			b.ReportMetric(float64(b.N*len(req.SourceIds))/b.Elapsed().Seconds(), "decisions/s")
		})
		b.Run("unary/"+table.name, func(b *testing.B) {
			b.ReportAllocs()
			reqs := make([]*verdictv1.DecideRequest, len(flows))
			for i, f := range flows {
				reqs[i] = &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: f.Source}, Destination: &verdictv1.Endpoint{Tags: f.Destination},
					Protocol: f.Protocol.String(), Port: f.Port}
			}
			cpu := processCPU()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := h.dec.Decide(ctx, reqs[n.Add(1)%int64(len(reqs))]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/call")
		})
	}
}

// processCPU is the process's user and system time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

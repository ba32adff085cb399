package loadtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/syncer"
)

// emptyDecisions answers every DecisionService call at once with a fixed answer
// shaped like a real one (two matched sides, a policy name): the ceiling.
type emptyDecisions struct {
	verdictv1.UnimplementedDecisionServiceServer
	resp *verdictv1.DecideResponse
}

func newEmptyDecisions() emptyDecisions {
	side := &verdictv1.SideDecision{Action: verdictv1.Action_ACTION_ALLOW, Policy: "p-004242-svc-17-to-svc-42",
		Rule: "sources[0]/destinations[0]", Reason: verdictv1.Reason_REASON_MATCHED}
	return emptyDecisions{resp: &verdictv1.DecideResponse{Action: verdictv1.Action_ACTION_ALLOW, Outbound: side, Inbound: side,
		Policy: side.Policy, Revision: 100042}}
}

func (e emptyDecisions) Decide(context.Context, *verdictv1.DecideRequest) (*verdictv1.DecideResponse, error) {
	return e.resp, nil
}

func (e emptyDecisions) DecideBatch(_ context.Context, req *verdictv1.DecideBatchRequest) (*verdictv1.DecideBatchResponse, error) {
	out := &verdictv1.DecideBatchResponse{Results: make([]*verdictv1.DecideResult, len(req.Requests)), Revision: e.resp.Revision}
	r := &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Response{Response: e.resp}}
	for i := range out.Results {
		out.Results[i] = r
	}
	return out, nil
}

func (e emptyDecisions) DecideStream(st verdictv1.DecisionService_DecideStreamServer) error {
	r := &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Response{Response: e.resp}}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&verdictv1.DecideStreamResponse{Id: m.Id, Result: r}); err != nil {
			return err
		}
	}
}

// compactAnswers is the empty handler's answer words: ALLOW by policy 1.
var compactAnswers = func() []uint32 {
	out := make([]uint32, 1000)
	for i := range out {
		out[i] = 1 | 1<<8
	}
	return out
}()

func (e emptyDecisions) compact(req *verdictv1.DecideCompactRequest) *verdictv1.DecideCompactResponse {
	n := min(len(req.GetSourceIds()), len(compactAnswers))
	return &verdictv1.DecideCompactResponse{Answers: compactAnswers[:n], Policies: []string{e.resp.Policy}, Revision: e.resp.Revision}
}

func (e emptyDecisions) DecideCompact(_ context.Context, req *verdictv1.DecideCompactRequest) (*verdictv1.DecideCompactResponse, error) {
	return e.compact(req), nil
}

func (e emptyDecisions) DecideCompactStream(st verdictv1.DecisionService_DecideCompactStreamServer) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&verdictv1.DecideCompactStreamResponse{Id: m.GetId(), Batch: e.compact(m.GetBatch())}); err != nil {
			return err
		}
	}
}

// ServeBaseline serves the empty DecisionService and Authorization on lis until ctx ends, with the
// gRPC options verdictd's server uses (interceptors, limits, keepalive, the
// otelgrpc stats handler recording into a Prometheus registry of its own, as
// verdictd's does).
func ServeBaseline(ctx context.Context, lis net.Listener, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = meters.Shutdown(context.Background()) }() // nothing is exported
	srv, err := server.New(server.Config{Syncer: staticSyncer{snap: engine.Empty()}, Store: memory.New(memory.Config{}),
		Logger: log, MeterProvider: meters})
	if err != nil {
		return err
	}
	g := grpc.NewServer(srv.ServerOptions()...)
	verdictv1.RegisterDecisionServiceServer(g, newEmptyDecisions())
	authv3.RegisterAuthorizationServer(g, newEmptyAuthz())
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	if err := g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// staticSyncer is a syncer.API with one empty snapshot, synced: the baseline
// server reads nothing from it.
type staticSyncer struct{ snap *engine.Snapshot }

func (s staticSyncer) Snapshot() *engine.Snapshot { return s.snap }
func (s staticSyncer) Synced() bool               { return true }
func (s staticSyncer) Stale() bool                { return false }
func (s staticSyncer) Status() syncer.Status      { return syncer.Status{Synced: true} }
func (s staticSyncer) WaitFor(context.Context, int64) (*engine.Snapshot, error) {
	return s.snap, nil
}
func (s staticSyncer) Subscribe(int) syncer.Subscription {
	return &noUpdates{ch: make(chan syncer.Update)}
}

type noUpdates struct{ ch chan syncer.Update }

func (n *noUpdates) Updates() <-chan syncer.Update { return n.ch }
func (n *noUpdates) Err() error                    { return nil }
func (n *noUpdates) Close()                        {}

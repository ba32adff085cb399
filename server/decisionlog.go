package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// decisionLogService implements verdict.v1.DecisionLogService.
type decisionLogService struct {
	verdictv1.UnimplementedDecisionLogServiceServer
	log       *slog.Logger
	stop      <-chan struct{}     // closed when the server stops: streams end
	decisions *decisionlog.Logger // nil: the log is off
}

var _ verdictv1.DecisionLogServiceServer = decisionLogService{}

// followBuffer is how many records a follower may hold unsent before it is
// dropped.
const followBuffer = 1024

// Follow streams the records that match the request until the client goes,
// the server stops, or the follower falls behind (RESOURCE_EXHAUSTED).
func (s decisionLogService) Follow(req *verdictv1.FollowRequest, stream grpc.ServerStreamingServer[verdictv1.FollowResponse]) error {
	ctx := stream.Context()
	l := s.decisions
	if l == nil {
		return toStatus(ctx, s.log, errDecisionLogOff)
	}
	// The filter goes first, so that a follower of records the daemon never
	// logs can say why it sees none.
	if err := stream.SendHeader(metadata.Pairs(decisionlog.FilterHeader, l.Filter().String())); err != nil {
		return err
	}
	f := l.Follow(followMatch(req), followBuffer)
	defer l.Close(f)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case <-f.Done():
			if err := f.Err(); err != nil {
				return toStatus(ctx, s.log, fmt.Errorf("%w: %w", errFellBehind, err))
			}
			return nil
		case r := <-f.Records():
			if err := stream.Send(&verdictv1.FollowResponse{Record: r}); err != nil {
				return err
			}
		}
	}
}

// followMatch: every filter given must hold. A summary record (of the
// records dropped) passes filters of mesh and type only.
func followMatch(req *verdictv1.FollowRequest) decisionlog.Match {
	return func(r *decisionlog.Record) bool {
		if r.GetDropped() != nil { // a summary: it carries no type, and names the meshes it counts
			return req.GetAction() == "" && req.GetPolicy() == "" && !req.GetAuditOnly() && req.GetWorkload() == "" &&
				(req.GetMesh() == "" || slices.ContainsFunc(r.GetDropped(), func(d *verdictv1.RecordsDropped) bool { return d.GetMesh() == req.GetMesh() }))
		}
		if req.GetMesh() != "" && req.GetMesh() != r.GetMesh() || req.GetType() != "" && req.GetType() != r.GetType() {
			return false
		}
		if req.GetAction() != "" && !strings.EqualFold(req.GetAction(), r.GetAction()) {
			return false
		}
		if p := req.GetPolicy(); p != "" && p != r.GetPolicy() && p != r.GetOutbound().GetPolicy() && p != r.GetInbound().GetPolicy() {
			return false
		}
		if req.GetAuditOnly() && r.GetAudit() == nil {
			return false
		}
		if w := req.GetWorkload(); w != "" && !endpointIs(r.GetSource(), w) && !endpointIs(r.GetDestination(), w) {
			return false
		}
		return true
	}
}

func endpointIs(e *verdictv1.RecordEndpoint, w string) bool {
	if e.GetWorkload() == w || e.GetAddress() == w || e.GetPrincipal() == w {
		return true
	}
	for _, v := range e.GetTags() {
		if v == w {
			return true
		}
	}
	return false
}

// registerDecisionLogMetrics: records offered, written and dropped (per mesh
// and reason, bounded as decisionlog.MaxDropMeshes says), decisions counted as
// repeats, records truncated, sink errors, followers dropped, and the queue's
// depth.
func registerDecisionLogMetrics(meter metric.Meter, l *decisionlog.Logger) error {
	counter := func(name, desc string) (metric.Int64ObservableCounter, error) {
		return meter.Int64ObservableCounter(name, metric.WithDescription(desc))
	}
	offered, err1 := counter("verdict.decision_log.offered", "Decision records offered to the decision log.")
	written, err2 := counter("verdict.decision_log.written", "Decision records written to the sinks (not counting the repeats and summary records the log writes of its own).")
	dropped, err3 := counter("verdict.decision_log.dropped", fmt.Sprintf(
		"Decision records dropped, by mesh (the first %d meshes that dropped any; the others as %q) and reason (queue_full).",
		decisionlog.MaxDropMeshes, decisionlog.OtherMesh))
	sinkErrs, err4 := counter("verdict.decision_log.sink_errors", "Batches a sink failed to write.")
	followers, err5 := counter("verdict.decision_log.followers_dropped", "Followers (verdictctl logs) dropped for falling behind.")
	depth, err6 := meter.Int64ObservableGauge("verdict.decision_log.queue_depth", metric.WithDescription("Decision records waiting to be written."))
	repeats, err7 := counter("verdict.decision_log.repeats", "Decisions counted into a record's repeats instead of logged one by one.")
	truncated, err8 := counter("verdict.decision_log.truncated", "Decision records cut to the record size cap.")
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil {
		return err
	}
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := l.Stats()
		o.ObserveInt64(offered, st.Offered)
		o.ObserveInt64(written, st.Written)
		l.Drops(func(mesh, reason string, n int64) {
			o.ObserveInt64(dropped, n, metric.WithAttributes(attribute.String("mesh", mesh), attribute.String("reason", reason)))
		})
		o.ObserveInt64(sinkErrs, st.SinkErrors)
		o.ObserveInt64(followers, st.FollowersDropped)
		o.ObserveInt64(depth, int64(st.QueueDepth))
		o.ObserveInt64(repeats, st.Repeats)
		o.ObserveInt64(truncated, st.Truncated)
		return nil
	}, offered, written, dropped, sinkErrs, followers, depth, repeats, truncated)
	return err
}

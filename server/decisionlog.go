package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine"
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
		if req.GetMesh() != "" && req.GetMesh() != r.GetMesh() || req.GetType() != "" && req.GetType() != r.GetType() {
			return false
		}
		if r.GetDropped() != nil {
			return req.GetAction() == "" && req.GetPolicy() == "" && !req.GetAuditOnly() && req.GetWorkload() == ""
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

// maxPolicyLabels bounds the distinct policy labels of
// verdict_decisions_by_policy_total: the policies beyond it count as "other",
// so that no number of policies can grow the metrics without bound.
const maxPolicyLabels = 256

// policyCounts counts decisions by deciding policy and action, and the
// decisions whose shadow (audit) result differs, by shadow action.
//
// The counts by policy are atomics of its own, read by an observable counter
// when the metrics are collected: a compact batch of 1,000 flows on 10k
// policies counts hundreds of policies, and a synchronous counter's Add
// (attribute set lookup, exemplar filter, its own sync map) was a fifth of
// verdictd's CPU in the two-process run (BENCHMARKS.md). An add is now a read
// of an immutable map and one atomic add.
type policyCounts struct {
	audits  metric.Int64Counter
	auditBy [2][]metric.AddOption // shadow ALLOW, shadow DENY
	// cells holds the first maxPolicyLabels policies' counts, an immutable
	// map replaced whole (under mu) when a policy is added.
	cells atomic.Pointer[map[string]*policyCell]
	mu    sync.Mutex
	other policyCell // the policies beyond maxPolicyLabels
}

// policyCell is one policy's counts by final action (ALLOW, DENY) and their
// attribute sets.
type policyCell struct {
	n    [2]atomic.Int64
	opts [2]metric.ObserveOption
}

func newPolicyCell(policy string) *policyCell {
	c := &policyCell{}
	for i, a := range [2]string{"ALLOW", "DENY"} {
		c.opts[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("policy", policy), attribute.String("action", a)))
	}
	return c
}

func newPolicyCounts(meter metric.Meter) (*policyCounts, error) {
	audits, err := meter.Int64Counter("verdict.decisions.audit_differences",
		metric.WithDescription("Flows whose shadow decision (audit rules enforced too) has another final action than the enforced one, by the shadow action."))
	if err != nil {
		return nil, err
	}
	shadow := func(a string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("action", a)))}
	}
	p := &policyCounts{audits: audits, auditBy: [2][]metric.AddOption{shadow("ALLOW"), shadow("DENY")}}
	p.other = *newPolicyCell("other")
	p.cells.Store(&map[string]*policyCell{})
	counter, err := meter.Int64ObservableCounter("verdict.decisions.by_policy",
		metric.WithDescription("Flows decided, by the policy that decided the final action (\"\" none; \"other\" beyond the first 256 policies) and action."))
	if err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe := func(c *policyCell) {
			for i := range c.n {
				if n := c.n[i].Load(); n > 0 { // a series appears with its first decision
					o.ObserveInt64(counter, n, c.opts[i])
				}
			}
		}
		for _, c := range *p.cells.Load() {
			observe(c)
		}
		observe(&p.other)
		return nil
	}, counter); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *policyCounts) add(ctx context.Context, d *engine.Decision) {
	p.addN(ctx, d.Policy, d.Action == engine.Deny, 1)
	if d.Audit != nil {
		p.auditN(ctx, d.Audit.Action == engine.Deny, 1)
	}
}

// auditN counts n decisions whose shadow result differs, by shadow action.
func (p *policyCounts) auditN(ctx context.Context, shadowDeny bool, n int64) {
	p.audits.Add(ctx, n, p.auditBy[b2i(shadowDeny)]...)
}

// addN counts n decisions of one policy and final action.
func (p *policyCounts) addN(_ context.Context, policy string, deny bool, n int64) {
	p.cell(policy).n[b2i(deny)].Add(n)
}

// cell is policy's counts: its own among the first maxPolicyLabels policies
// seen, else other's.
func (p *policyCounts) cell(policy string) *policyCell {
	if c, ok := (*p.cells.Load())[policy]; ok {
		return c
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.cells.Load()
	if c, ok := old[policy]; ok {
		return c
	}
	if len(old) >= maxPolicyLabels {
		return &p.other
	}
	m := make(map[string]*policyCell, len(old)+1)
	maps.Copy(m, old)
	c := newPolicyCell(policy)
	m[policy] = c
	p.cells.Store(&m)
	return c
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

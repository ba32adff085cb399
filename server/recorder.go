package server

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// recorder is where every decision path hands its answers — Decide,
// DecideBatch, DecideStream, Check, DecideCompact and DecideCompactStream
// alike: the counts (verdict_decisions_total, verdict_decisions_by_policy_total,
// verdict_decisions_audit_differences_total, the compact path's memo
// lookups), the engine's time (verdict_decide_duration_seconds, where a flow
// is timed alone), the decision log, and the observed-flows table (the
// compact path counts its flows into a batch of the table: observe.go). A
// call's flows go through one tally,
// whose counts are added to the metrics once, by done; the call's part of
// every record (its RPC, its caller) is built once, for its first record.
// Nothing here blocks a decision.
type recorder struct {
	metrics  *metrics
	byPolicy *policyCounts
	log      *decisionlog.Logger // nil: the log is off
	observed *observed.Table     // nil: no table
	seed     maphash.Seed        // of the records' repeat keys
}

func newRecorder(m *metrics, byPolicy *policyCounts, log *decisionlog.Logger, obs *observed.Table) *recorder {
	return &recorder{metrics: m, byPolicy: byPolicy, log: log, observed: obs, seed: maphash.MakeSeed()}
}

// tally is one call's (or one stream message's) flows on their way to the
// recorder. The zero tally is ready; done adds it to the metrics.
type tally struct {
	n      [2]int64 // decisions by final action: ALLOW, DENY
	audits [2]int64 // decisions whose shadow result differs, by shadow action
	memo   [2]int64 // compact flows answered from the pair memo: hit, miss
	// The call's part of its records: set by call, for the first record.
	called  bool
	rpc     string
	caller  *verdictv1.RecordCaller // shared by the call's records
	callKey uint64                  // the hash of rpc and caller
}

// decided hands the recorder one decision of a flow timed alone (every
// path but the compact one): counted into t, its time recorded, its record
// offered to the log.
func (r *recorder) decided(ctx context.Context, t *tally, er *engine.Request, d *engine.Decision, took time.Duration, at time.Time) {
	deny := d.Action == resource.Deny
	t.n[b2i(deny)]++
	if d.Audit != nil {
		t.audits[b2i(d.Audit.Action == resource.Deny)]++
	}
	r.byPolicy.addN(ctx, d.Policy, deny, 1)
	r.metrics.duration.Record(ctx, took.Seconds())
	if r.observed != nil {
		r.observe(er, d, at)
	}
	if r.log.Wants(deny, d.Audit != nil) {
		r.logged(ctx, t, er, d, took)
	}
}

// logged offers a decision the log wants: counted as a repeat of the same
// flow's record, or built and queued. The compact path calls it directly.
func (r *recorder) logged(ctx context.Context, t *tally, er *engine.Request, d *engine.Decision, took time.Duration) {
	r.call(ctx, t)
	var key uint64 // none when every decision is written
	if r.log.CountsRepeats() {
		key = r.key(t, er, d)
		if r.log.Repeat(key) {
			return
		}
	}
	r.log.Log(key, t.record(er, d, took))
}

// done adds t's counts to the metrics.
func (r *recorder) done(ctx context.Context, t *tally) {
	r.metrics.decidedN(t.n[0], t.n[1])
	r.metrics.memoN(t.memo[0], t.memo[1])
	for shadowDeny, n := range t.audits {
		if n > 0 {
			r.byPolicy.auditN(ctx, shadowDeny == 1, n)
		}
	}
}

// call sets t's part of its records, once per call.
func (r *recorder) call(ctx context.Context, t *tally) {
	if t.called {
		return
	}
	t.called = true
	t.rpc = rpcName(ctx)
	c := &verdictv1.RecordCaller{}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		c.Address = p.Addr.String()
	}
	if cert := verifiedClientCert(ctx); cert != nil {
		if ids := certIdentities(cert); len(ids) > 0 {
			c.Identity = ids[0]
		}
	}
	t.caller = c
	// The caller is its host (and identity): one host's connections, each
	// from a port of its own, repeat each other's decisions.
	host := c.Address
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	var buf [256]byte
	t.callKey = maphash.Bytes(r.seed, appendKeyStrings(buf[:0], t.rpc, host, c.Identity))
}

// rpcName is the method's last element: Decide, DecideBatch, DecideStream,
// Check, DecideCompact, DecideCompactStream.
func rpcName(ctx context.Context) string {
	m, _ := grpc.Method(ctx)
	return m[strings.LastIndexByte(m, '/')+1:]
}

// key is the repeat key of a decision's record: a hash of everything the
// record says but its time and latency — the call (RPC, caller's host and
// identity: the port of its connection aside), the flow
// (mesh, type, each end as given and the identity of the tags it was
// decided on, protocol, port), the revision and the answer. Reserved tags
// (ip, principal) count too where a side is given as tags: the identity
// leaves them out.
func (r *recorder) key(t *tally, er *engine.Request, d *engine.Decision) uint64 {
	var buf [512]byte // the key's bytes, hashed at once: usually no allocation
	b := binary.LittleEndian.AppendUint64(buf[:0], t.callKey)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.Revision))
	b = binary.LittleEndian.AppendUint64(b, uint64(er.Protocol)<<32|uint64(er.Port))
	b = binary.LittleEndian.AppendUint64(b, uint64(d.Action)<<8|uint64(d.Outbound.Reason)<<16|uint64(d.Inbound.Reason)<<32|
		uint64(d.Outbound.Action)<<48|uint64(d.Inbound.Action)<<56)
	b = appendKeyEnd(b, er.SourceEndpoint, &d.SourceResolution)
	b = appendKeyEnd(b, er.DestinationEndpoint, &d.DestinationResolution)
	b = appendKeyStrings(b, er.Mesh, er.Type, d.Policy, d.Outbound.Policy, d.Outbound.Scope, d.Outbound.Rule,
		d.Inbound.Policy, d.Inbound.Scope, d.Inbound.Rule)
	if a := d.Audit; a != nil {
		b = append(b, byte(a.Action)+1)
		b = appendKeyStrings(b, a.Policy, a.Scope, a.Rule, a.Side)
	}
	return maphash.Bytes(r.seed, b) | 1 // never 0: 0 is "no key"
}

func appendKeyEnd(b []byte, ep *inventory.Endpoint, res *inventory.EndpointResolution) []byte {
	b = binary.LittleEndian.AppendUint64(b, res.Identity)
	if ep != nil {
		b = binary.LittleEndian.AppendUint64(b, ep.Identity)
		return appendKeyStrings(b, ep.Workload, ep.Address, ep.Principal)
	}
	return appendKeyStrings(b, res.Tags[resource.IPTag], res.Tags[resource.PrincipalTag])
}

// appendKeyStrings appends each string and its end, so that ("ab", "c") and
// ("a", "bc") differ.
func appendKeyStrings(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = append(append(b, s...), 0)
	}
	return b
}

// recordParts are the messages of one record, allocated together.
type recordParts struct {
	rec      verdictv1.DecisionRecord
	src, dst verdictv1.RecordEndpoint
	out, in  verdictv1.RecordSide
	time     timestamppb.Timestamp
}

// record is the decision's record. Its tag maps are the engine's (shared,
// never modified: the log replaces what it cuts).
func (t *tally) record(er *engine.Request, d *engine.Decision, took time.Duration) *decisionlog.Record {
	p := new(recordParts)
	now := time.Now()
	p.time.Seconds, p.time.Nanos = now.Unix(), int32(now.Nanosecond())
	r := &p.rec
	r.Time, r.Rpc, r.Revision, r.Mesh, r.Type = &p.time, t.rpc, d.Revision, er.Mesh, er.Type
	if r.Mesh == "" {
		r.Mesh = resource.DefaultMesh
	}
	if r.Type == "" {
		r.Type = resource.DefaultType
	}
	r.Source, r.Destination = recordEnd(&p.src, er.SourceEndpoint, &d.SourceResolution), recordEnd(&p.dst, er.DestinationEndpoint, &d.DestinationResolution)
	r.Protocol, r.Port, r.Action, r.Policy = er.Protocol.String(), er.Port, d.Action.String(), d.Policy
	r.Outbound, r.Inbound = recordSide(&p.out, &d.Outbound), recordSide(&p.in, &d.Inbound)
	if a := d.Audit; a != nil {
		r.Audit = &verdictv1.RecordAudit{Action: a.Action.String(), Policy: a.Policy, Scope: a.Scope, Rule: a.Rule, Side: a.Side}
	}
	r.Caller, r.LatencyNs = t.caller, took.Nanoseconds()
	return r
}

// recordEnd is one end of the flow as the request gave it (ep nil: as
// tags), with the tags it was decided on.
func recordEnd(out *verdictv1.RecordEndpoint, ep *inventory.Endpoint, res *inventory.EndpointResolution) *verdictv1.RecordEndpoint {
	out.Tags = res.Tags
	if ep != nil {
		out.Workload, out.Address, out.Principal, out.Identity = ep.Workload, ep.Address, ep.Principal, ep.Identity
	}
	return out
}

func recordSide(out *verdictv1.RecordSide, s *engine.SideDecision) *verdictv1.RecordSide {
	out.Action, out.Policy, out.Scope, out.Rule, out.Reason = s.Action.String(), s.Policy, s.Scope, s.Rule, s.Reason.String()
	return out
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

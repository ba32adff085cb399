// Package apiconv converts between the API's messages (proto/verdict/v1) and
// the engine's types: resources both ways, decide and resolve requests in,
// decisions, resolutions and rule lists out. The server, verdictctl, the load
// tester and the harnesses share it; it imports neither the server nor gRPC.
package apiconv

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Resources cross the API as messages whose protobuf JSON is the engine's
// canonical document. Inbound (Apply), proto → protojson → resource.DecodeJSON:
// the engine's decoder is the one validator of resources (field paths,
// defaults, limits), so a write goes through it rather than through a second
// mapping that would have to validate alike. Outbound (watch, Get, List),
// field by field (resource.go).

// ResourceFromProto decodes an API resource; field paths of its errors start
// with path ("resources[2]") and name the oneof member (".policy.sources[0]").
func ResourceFromProto(path string, r *verdictv1.Resource) (resource.Resource, error) {
	var (
		msg  proto.Message
		kind string
		name string
	)
	switch t := r.GetResource().(type) {
	case *verdictv1.Resource_Mesh:
		msg, kind, name = t.Mesh, "Mesh", "mesh"
		if t.Mesh != nil && t.Mesh.Kind == "" {
			m := proto.CloneOf(t.Mesh)
			m.Kind = kind
			msg = m
		}
	case *verdictv1.Resource_Scope:
		msg, kind, name = t.Scope, "Scope", "scope"
		if t.Scope != nil && t.Scope.Kind == "" {
			m := proto.CloneOf(t.Scope)
			m.Kind = kind
			msg = m
		}
	case *verdictv1.Resource_Policy:
		msg, kind, name = t.Policy, "Policy", "policy"
		if t.Policy != nil && t.Policy.Kind == "" {
			m := proto.CloneOf(t.Policy)
			m.Kind = kind
			msg = m
		}
	case *verdictv1.Resource_Workload:
		return WorkloadFromProto(path, t.Workload)
	default:
		return nil, &resource.ValidationError{Errors: []resource.FieldError{{Field: path, Reason: "a resource is one of mesh, scope, policy or workload"}}}
	}
	b, err := protojson.Marshal(msg)
	if err != nil {
		// A value JSON cannot hold (a NaN or infinite number in a conf): the
		// client's mistake, not the server's.
		return nil, &resource.ValidationError{Errors: []resource.FieldError{{Field: path + "." + name,
			Reason: fmt.Sprintf("does not encode as JSON: %s", cleanProtoErr(err))}}}
	}
	res, err := resource.DecodeJSON(b)
	if err != nil {
		if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
			return nil, ve.Prefixed(path + "." + name)
		}
		return nil, err
	}
	if k := res.Key().Kind.String(); k != kind {
		return nil, &resource.ValidationError{Errors: []resource.FieldError{{Field: path + "." + name + ".kind",
			Reason: fmt.Sprintf("%q in the %s member of a resource", k, name)}}}
	}
	return res, nil
}

// StoredResource is an entry of the snapshot as the API shows it.
func StoredResource(key string, r resource.Resource, rerr error) (*verdictv1.StoredResource, error) {
	out := &verdictv1.StoredResource{Key: key}
	if rerr != nil {
		out.Error = rerr.Error()
	}
	if r == nil {
		return out, nil
	}
	m := r.Metadata()
	out.CreateRevision, out.ModRevision = m.CreateRevision, m.ModRevision
	if w, ok := r.(*resource.Workload); ok {
		out.Identity = w.Identity()
	}
	pr, err := ResourceToProto(r)
	if err != nil {
		return nil, err
	}
	out.Resource = pr
	return out, nil
}

// DecideRequest translates a DecideRequest; its fields are validated by
// validateDecide.
func DecideRequest(r *verdictv1.DecideRequest) engine.Request {
	p, _ := resource.ParseProtocol(r.GetProtocol())
	req := engine.Request{Mesh: r.GetMesh(), Type: r.GetType(), Protocol: p, Port: r.GetPort(), Explain: r.GetExplain()}
	req.Source, req.SourceEndpoint = Endpoint(r.GetSource())
	req.Destination, req.DestinationEndpoint = Endpoint(r.GetDestination())
	return req
}

// Endpoint translates one end of a flow: its tags when it is given as tags
// (the common case costs no allocation), else the engine's endpoint, which
// keeps every form given so that validation can name a second one.
func Endpoint(e *verdictv1.Endpoint) (resource.Tags, *inventory.Endpoint) {
	if e.GetWorkload() == "" && e.GetAddress() == "" && e.GetPrincipal() == "" && e.GetIdentity() == 0 {
		return e.GetTags(), nil
	}
	return nil, &inventory.Endpoint{Tags: e.GetTags(), Workload: e.GetWorkload(), Address: e.GetAddress(),
		Principal: e.GetPrincipal(), Identity: e.GetIdentity()}
}

// EndpointResolution translates how one end of a flow was resolved in mesh;
// the tags are given only with explain (they can be many). A side given as
// tags whose identity the engine was not asked for (engine.Request's
// TagIdentities) gets it computed here.
func EndpointResolution(mesh string, r *inventory.EndpointResolution, explain bool) *verdictv1.EndpointResolution {
	out := &verdictv1.EndpointResolution{}
	fillResolution(out, mesh, r, explain)
	return out
}

func fillResolution(out *verdictv1.EndpointResolution, mesh string, r *inventory.EndpointResolution, explain bool) {
	id := r.Identity
	if id == 0 && r.Form == inventory.FormTags {
		id = resource.Identity(mesh, r.Tags)
	}
	out.Form, out.ResolvedAs = EndpointForm(r.Form), ResolvedAs(r.ResolvedAs)
	out.Workload, out.Holders, out.Identity = r.Workload, uint32(r.Holders), id
	if explain {
		out.Tags = r.Tags
	}
}

func EndpointForm(f inventory.EndpointForm) verdictv1.EndpointForm {
	switch f {
	case inventory.FormTags:
		return verdictv1.EndpointForm_ENDPOINT_FORM_TAGS
	case inventory.FormWorkload:
		return verdictv1.EndpointForm_ENDPOINT_FORM_WORKLOAD
	case inventory.FormAddress:
		return verdictv1.EndpointForm_ENDPOINT_FORM_ADDRESS
	case inventory.FormPrincipal:
		return verdictv1.EndpointForm_ENDPOINT_FORM_PRINCIPAL
	case inventory.FormIdentity:
		return verdictv1.EndpointForm_ENDPOINT_FORM_IDENTITY
	}
	return verdictv1.EndpointForm_ENDPOINT_FORM_UNSPECIFIED
}

func ResolvedAs(a inventory.ResolvedAs) verdictv1.ResolvedAs {
	switch a {
	case inventory.AsTags:
		return verdictv1.ResolvedAs_RESOLVED_AS_TAGS
	case inventory.AsWorkload:
		return verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD
	case inventory.AsExternal:
		return verdictv1.ResolvedAs_RESOLVED_AS_EXTERNAL
	case inventory.AsPrincipalHolders:
		return verdictv1.ResolvedAs_RESOLVED_AS_PRINCIPAL_HOLDERS
	case inventory.AsKumaSpiffe:
		return verdictv1.ResolvedAs_RESOLVED_AS_KUMA_SPIFFE
	case inventory.AsUnknownPrincipal:
		return verdictv1.ResolvedAs_RESOLVED_AS_UNKNOWN_PRINCIPAL
	case inventory.AsIdentity:
		return verdictv1.ResolvedAs_RESOLVED_AS_IDENTITY
	}
	return verdictv1.ResolvedAs_RESOLVED_AS_UNSPECIFIED
}

func Action(a resource.Action) verdictv1.Action {
	switch a {
	case resource.Allow:
		return verdictv1.Action_ACTION_ALLOW
	case resource.Deny:
		return verdictv1.Action_ACTION_DENY
	}
	return verdictv1.Action_ACTION_UNSPECIFIED
}

func Reason(r engine.Reason) verdictv1.Reason {
	switch r {
	case engine.ReasonMatched:
		return verdictv1.Reason_REASON_MATCHED
	case engine.ReasonCatchAll:
		return verdictv1.Reason_REASON_CATCH_ALL
	case engine.ReasonDefaultAction:
		return verdictv1.Reason_REASON_DEFAULT_ACTION
	case engine.ReasonUnenforced:
		return verdictv1.Reason_REASON_UNENFORCED
	case engine.ReasonNotApplicable:
		return verdictv1.Reason_REASON_NOT_APPLICABLE
	case engine.ReasonInvalidResource:
		return verdictv1.Reason_REASON_INVALID_RESOURCE
	}
	return verdictv1.Reason_REASON_UNSPECIFIED
}

func Side(s *engine.SideDecision) *verdictv1.SideDecision {
	out := &verdictv1.SideDecision{}
	fillSide(out, s)
	return out
}

func fillSide(out *verdictv1.SideDecision, s *engine.SideDecision) {
	out.Action, out.Policy, out.Scope, out.Rule, out.Reason = Action(s.Action), s.Policy, s.Scope, s.Rule, Reason(s.Reason)
}

// DecideAnswer holds the messages of one decision's answer, so that they are
// allocated together: one allocation for the five of an answer (DecideAnswer
// fills it), or one for a whole batch's in a slice of them.
type DecideAnswer struct {
	Response    verdictv1.DecideResponse
	sides       [2]verdictv1.SideDecision
	resolutions [2]verdictv1.EndpointResolution
}

// DecideAnswer translates a decision on a flow of mesh into a (zero, or
// never sent) and returns its response: the sides, the conf from the cache,
// the explanation, the audit, and how each end was resolved (their tags only
// with explain).
func (c *ConfCache) DecideAnswer(a *DecideAnswer, mesh string, d *engine.Decision, explain bool) *verdictv1.DecideResponse {
	out := &a.Response
	fillSide(&a.sides[0], &d.Outbound)
	fillSide(&a.sides[1], &d.Inbound)
	out.Action, out.Outbound, out.Inbound = Action(d.Action), &a.sides[0], &a.sides[1]
	out.Policy, out.Conf, out.Revision = d.Policy, c.Get(d.Conf), d.Revision
	if d.Explain != nil {
		out.Explanation = &verdictv1.Explanation{Outbound: Trace(&d.Explain.Outbound), Inbound: Trace(&d.Explain.Inbound)}
	}
	out.Audit = Audit(d.Audit)
	fillResolution(&a.resolutions[0], mesh, &d.SourceResolution, explain)
	fillResolution(&a.resolutions[1], mesh, &d.DestinationResolution, explain)
	out.SourceResolution, out.DestinationResolution = &a.resolutions[0], &a.resolutions[1]
	return out
}

// Audit translates a decision's shadow result; nil for none.
func Audit(a *engine.Audit) *verdictv1.Audit {
	if a == nil {
		return nil
	}
	return &verdictv1.Audit{Action: Action(a.Action), Policy: a.Policy, Scope: a.Scope, Rule: a.Rule, Side: a.Side}
}

func Trace(t *engine.SideTrace) *verdictv1.SideTrace {
	out := &verdictv1.SideTrace{Members: t.Members, MostSpecificScope: t.MostSpecificScope, Reason: Reason(t.Reason),
		Truncated: t.Truncated}
	for _, c := range t.Candidates {
		out.Candidates = append(out.Candidates, &verdictv1.CandidateTrace{
			Policy: c.Policy, Scope: c.Scope, Phase: c.Phase, Priority: c.Priority, Rank: c.Rank, Rule: c.Rule,
			Action: Action(c.Action), Matched: c.Matched, Decided: c.Decided, Why: c.Why,
			Audit: c.Audit,
		})
	}
	for _, n := range t.NotCandidates {
		out.NotCandidates = append(out.NotCandidates, &verdictv1.NonCandidate{Policy: n.Policy, Why: n.Why})
	}
	return out
}

func ResolveRequest(r *verdictv1.ResolveRequest) engine.ResolveRequest {
	p, _ := resource.ParseProtocol(r.GetProtocol())
	req := engine.ResolveRequest{Mesh: r.GetMesh(), Type: r.GetType(), Protocol: p, Port: r.GetPort()}
	req.Source, req.SourceEndpoint = Endpoint(r.GetSource())
	req.Destination, req.DestinationEndpoint = Endpoint(r.GetDestination())
	return req
}

func PolicyState(s engine.PolicyState) verdictv1.PolicyState {
	switch s {
	case engine.Enforced:
		return verdictv1.PolicyState_POLICY_STATE_ENFORCED
	case engine.PartiallyEnforced:
		return verdictv1.PolicyState_POLICY_STATE_PARTIALLY_ENFORCED
	case engine.Overridden:
		return verdictv1.PolicyState_POLICY_STATE_OVERRIDDEN
	case engine.Audited:
		return verdictv1.PolicyState_POLICY_STATE_AUDIT
	}
	return verdictv1.PolicyState_POLICY_STATE_UNSPECIFIED
}

func Resolution(r *engine.Resolution) (*verdictv1.Resolution, error) {
	out := &verdictv1.Resolution{Side: r.Side}
	for _, rr := range r.Rules {
		v, err := structpb.NewValue(rr.Value)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", rr.Name, err)
		}
		out.Rules = append(out.Rules, &verdictv1.ResolvedRule{Name: rr.Name, Value: v, Policy: rr.Policy})
	}
	for _, ps := range r.Status {
		st := &verdictv1.PolicyStatus{Policy: ps.Policy, State: PolicyState(ps.State), Skipped: ps.Skipped}
		for _, m := range ps.Missing {
			st.Missing = append(st.Missing, &verdictv1.MissingRule{Rule: m.Rule, By: m.By, Why: m.Why})
		}
		out.Status = append(out.Status, st)
	}
	return out, nil
}

func ResolveResponse(res *engine.ResolveResult) (*verdictv1.ResolveResponse, error) {
	out := &verdictv1.ResolveResponse{Revision: res.Revision}
	if res.Main != nil {
		m, err := Resolution(res.Main)
		if err != nil {
			return nil, err
		}
		out.Side, out.Rules, out.Status = m.Side, m.Rules, m.Status
	}
	if res.Outbound != nil {
		o, err := Resolution(res.Outbound)
		if err != nil {
			return nil, err
		}
		out.Outbound = o
	}
	return out, nil
}

func Selectors(sels []resource.Selector) []*verdictv1.Selector {
	if len(sels) == 0 {
		return nil
	}
	out := make([]*verdictv1.Selector, len(sels))
	for i, s := range sels {
		ps := &verdictv1.Selector{Match: s.Match}
		for _, e := range s.Expressions {
			ps.Expressions = append(ps.Expressions, &verdictv1.Expression{Key: e.Key, Operator: e.Operator.String(), Values: e.Values})
		}
		out[i] = ps
	}
	return out
}

func Ports(ports []resource.PortEntry) []*verdictv1.PortEntry {
	if len(ports) == 0 {
		return nil
	}
	out := make([]*verdictv1.PortEntry, len(ports))
	for i, p := range ports {
		proto := p.Protocol.String()
		if proto == "" {
			proto = "ANY"
		}
		out[i] = &verdictv1.PortEntry{Protocol: proto, Ports: p.Ports}
	}
	return out
}

func SideRules(s *engine.SideRules) *verdictv1.SideRules {
	out := &verdictv1.SideRules{Fallback: Action(s.Fallback), FallbackReason: Reason(s.FallbackReason),
		Combine: s.Combine.String()}
	for _, r := range s.Rules {
		out.Rules = append(out.Rules, &verdictv1.Rule{
			Policy: r.Policy, Scope: r.Scope, Phase: r.Phase, Priority: r.Priority, Rule: r.Rule,
			Peer: Selectors(r.Peer), Ports: Ports(r.Ports), Action: Action(r.Action), Audit: r.Audit,
		})
	}
	return out
}

func RulesResponse(rev int64, rs *engine.RuleSet) *verdictv1.WatchRulesResponse {
	return &verdictv1.WatchRulesResponse{Revision: rev, Inbound: SideRules(&rs.Inbound), Outbound: SideRules(&rs.Outbound)}
}

// ConfCache converts confs to structpb once per conf object: Decide is the hot
// path, and a snapshot's conf objects are immutable and shared by every
// decision their rule makes. An entry is keyed by the map's identity and holds
// the map itself, so the address cannot be reused by another map while the
// entry lives. The cache is dropped whole when it grows past its bound.
type ConfCache struct {
	m     atomic.Pointer[sync.Map] // uintptr → *confEntry
	n     atomic.Int64
	limit int64
}

type confEntry struct {
	conf resource.Object // keeps the key's map alive
	pb   *structpb.Struct
}

func NewConfCache(limit int) *ConfCache {
	c := &ConfCache{limit: int64(limit)}
	c.m.Store(&sync.Map{})
	return c
}

// Get returns conf as a Struct, shared (callers must not modify it); nil for
// no conf.
func (c *ConfCache) Get(conf resource.Object) *structpb.Struct {
	if conf == nil {
		return nil
	}
	id := reflect.ValueOf(conf).Pointer()
	m := c.m.Load()
	if e, ok := m.Load(id); ok {
		return e.(*confEntry).pb
	}
	pb, err := structpb.NewStruct(conf)
	if err != nil {
		// Decoded JSON always converts; keep the answer rather than fail it.
		pb = &structpb.Struct{Fields: map[string]*structpb.Value{"error": structpb.NewStringValue(err.Error())}}
	}
	if c.n.Add(1) > c.limit {
		c.n.Store(0)
		c.m.Store(&sync.Map{})
		m = c.m.Load()
	}
	m.Store(id, &confEntry{conf: conf, pb: pb})
	return pb
}

func cleanProtoErr(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "proto: ")
	s = strings.TrimPrefix(s, "proto:\u00a0") // protobuf-go's non-breaking space
	return s
}

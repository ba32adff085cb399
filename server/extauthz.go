package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Envoy's external authorization (envoy.service.auth.v3.Authorization/Check)
// answered by the engine, for the HTTP filter and the network (L4) filter
// alike (docs/envoy.md). Envoy knows a peer by its address and certificate:
// a Check is mapped to a DecideRequest whose endpoints are given by reference
// (principal, address or workload name) and decided on Decide's own path
// (decideRequest, then decide: validation, snapshot, metrics, decision log).

// Keys of context_extensions (set per route in Envoy's HTTP filter
// configuration) and of the destination's labels (the node's bootstrap
// metadata under the filters' bootstrap_metadata_labels_key).
const (
	ExtAuthzMeshKey     = "verdict.mesh"
	ExtAuthzTypeKey     = "verdict.type"
	ExtAuthzWorkloadKey = "verdict.workload"
)

// Headers of an answer: the deciding policy and the revision.
const (
	HeaderPolicy   = "x-verdict-policy"
	HeaderRevision = "x-verdict-revision"
)

// checkFlow is a CheckRequest mapped to a flow; req is nil when the request
// cannot be mapped at all, and denial says why (the answer is then a DENY,
// never an error, so that not even failure_mode_allow can open it).
type checkFlow struct {
	req    *verdictv1.DecideRequest
	http   bool // from the HTTP filter (attributes.request.http is set)
	denial string
}

// mapCheck maps a CheckRequest as docs/envoy.md says. Destination:
// context_extensions' verdict.workload > the destination labels'
// verdict.workload > the other destination labels as tags >
// destination.principal > destination.address. Source: source.principal
// (authenticated by mTLS) > source.address. Port and protocol come from the
// destination's socket address. Mesh and type: context_extensions, then the
// destination labels, then Decide's defaults ("default", TrafficPermission).
func mapCheck(c *authv3.CheckRequest) checkFlow {
	a := c.GetAttributes()
	f := checkFlow{http: a.GetRequest().GetHttp() != nil}
	ext, labels := a.GetContextExtensions(), a.GetDestination().GetLabels()
	pick := func(key string) string {
		if v := ext[key]; v != "" {
			return v
		}
		return labels[key]
	}
	r := &verdictv1.DecideRequest{Mesh: pick(ExtAuthzMeshKey), Type: pick(ExtAuthzTypeKey)}
	dst := a.GetDestination()
	if sa := dst.GetAddress().GetSocketAddress(); sa != nil {
		// Envoy leaves protocol at its zero value, TCP (it sets only the
		// address and port: Network::Utility::addressToProtobufAddress).
		r.Port = sa.GetPortValue()
		r.Protocol = "TCP"
		if sa.GetProtocol() == corev3.SocketAddress_UDP {
			r.Protocol = "UDP"
		}
	}
	var why string
	if r.Destination, why = destinationEndpoint(ext, labels, dst); r.Destination == nil {
		f.denial = "destination: " + why
		return f
	}
	if r.Source, why = peerEndpoint(a.GetSource()); r.Source == nil {
		f.denial = "source: " + why
		return f
	}
	f.req = r
	return f
}

func destinationEndpoint(ext, labels map[string]string, dst *authv3.AttributeContext_Peer) (*verdictv1.Endpoint, string) {
	if w := ext[ExtAuthzWorkloadKey]; w != "" {
		return &verdictv1.Endpoint{Workload: w}, ""
	}
	if w := labels[ExtAuthzWorkloadKey]; w != "" {
		return &verdictv1.Endpoint{Workload: w}, ""
	}
	var tags map[string]string
	for k, v := range labels {
		if k != ExtAuthzMeshKey && k != ExtAuthzTypeKey {
			if tags == nil {
				tags = make(map[string]string, len(labels))
			}
			tags[k] = v
		}
	}
	if tags != nil {
		return &verdictv1.Endpoint{Tags: tags}, ""
	}
	return peerEndpoint(dst)
}

// peerEndpoint: the peer's principal (its certificate's URI SAN, else DNS SAN,
// else subject, as Envoy fills it on TLS connections), else the IP of its
// socket address. A pipe or an Envoy internal address has no IP: nil.
func peerEndpoint(p *authv3.AttributeContext_Peer) (*verdictv1.Endpoint, string) {
	if pr := p.GetPrincipal(); pr != "" {
		return &verdictv1.Endpoint{Principal: pr}, ""
	}
	sa := p.GetAddress().GetSocketAddress()
	if sa == nil {
		return nil, "neither a principal nor an IP socket address"
	}
	ip, err := netip.ParseAddr(sa.GetAddress())
	if err != nil {
		return nil, fmt.Sprintf("address %q is not an IP address", sa.GetAddress())
	}
	return &verdictv1.Endpoint{Address: ip.Unmap().WithZone("").String()}, ""
}

// authzService implements envoy.service.auth.v3.Authorization.
type authzService struct {
	authv3.UnimplementedAuthorizationServer
	log   *slog.Logger
	snaps snapshots // the current snapshot: Check has no min_revision
	dec   *decider
}

var _ authv3.AuthorizationServer = authzService{}

// Check answers a CheckRequest: OK when the flow's Decide allows it,
// PERMISSION_DENIED when it denies it or when the request cannot be decided
// for a reason of the request's own (over its size limit, unmappable,
// undecodable, an unknown mesh, type or workload, an invalid field). Only the
// server's own failures (an internal error, a cancelled call) are gRPC
// errors, which Envoy counts as a failed check: with failure_mode_allow false
// (its default) the request is refused.
func (s authzService) Check(ctx context.Context, c *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	snap := s.snaps.current()
	if err := checkRequest(ctx, c); err != nil {
		// An oversized request was not decoded: whether it came from the
		// HTTP filter is unknown, so it gets the HTTP filter's answer (a 403
		// with the reason), which the network filter reads as a DENY too.
		_, big := oversized(c)
		http := big || c.GetAttributes().GetRequest().GetHttp() != nil
		return deniedCheck(http, nil, snap.Revision(), "refused: "+err.Error()), nil
	}
	var f checkFlow
	if fe, ok := undecodable(c); ok {
		f.http = c.GetAttributes().GetRequest().GetHttp() != nil
		f.denial = fmt.Sprintf("%s: %s", fe.Field, fe.Reason)
	} else {
		f = mapCheck(c)
	}
	if f.req == nil {
		return deniedCheck(f.http, nil, snap.Revision(), "cannot be mapped to a flow: "+f.denial), nil
	}
	er, err := decideRequest(f.req)
	var resp *verdictv1.DecideResponse
	if err == nil {
		var t tally
		resp, err = s.dec.decide(ctx, &t, snap, &er, new(apiconv.DecideAnswer))
		s.dec.record.done(ctx, &t)
	}
	if err != nil {
		st := status.Convert(toStatus(ctx, s.log, err))
		switch st.Code() {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
			// The request's own fault (an unknown mesh, type or workload, a
			// field out of range): refused, never an error Envoy may let pass.
			return deniedCheck(f.http, nil, snap.Revision(), st.Message()), nil
		}
		return nil, st.Err()
	}
	if resp.GetAction() != verdictv1.Action_ACTION_ALLOW {
		return deniedCheck(f.http, resp, resp.GetRevision(), deniedWhy(resp)), nil
	}
	return allowedCheck(f.http, resp), nil
}

// allowedCheck is an ALLOW: OK, and for the HTTP filter the two headers
// added to the request sent upstream.
func allowedCheck(http bool, resp *verdictv1.DecideResponse) *authv3.CheckResponse {
	out := &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}, DynamicMetadata: checkMetadata(resp)}
	if http {
		out.HttpResponse = &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers: verdictHeaders(resp.GetPolicy(), resp.GetRevision()),
		}}
	}
	return out
}

// deniedWhy is the one line of a DENY: the deciding policy, else the reason
// of the side that denied.
func deniedWhy(r *verdictv1.DecideResponse) string {
	if r.GetPolicy() != "" {
		return "denied by policy " + r.GetPolicy()
	}
	side := r.GetInbound()
	if side.GetAction() == verdictv1.Action_ACTION_ALLOW {
		side = r.GetOutbound()
	}
	return "denied: " + side.GetReason().String()
}

func verdictHeaders(policy string, rev int64) []*corev3.HeaderValueOption {
	h := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	return []*corev3.HeaderValueOption{h(HeaderPolicy, policy), h(HeaderRevision, strconv.FormatInt(rev, 10))}
}

// deniedCheck is a DENY: PERMISSION_DENIED, and for the HTTP filter a 403
// with the two headers and a one-line body (the network filter closes the
// connection; it has no body to send). resp, the decision, is nil when the
// request was refused before one; its metadata goes to the access logs.
func deniedCheck(http bool, resp *verdictv1.DecideResponse, rev int64, why string) *authv3.CheckResponse {
	out := &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied), Message: why}}
	if resp != nil {
		out.DynamicMetadata = checkMetadata(resp)
	} else {
		out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"action":   structpb.NewStringValue(verdictv1.Action_ACTION_DENY.String()),
			"revision": structpb.NewNumberValue(float64(rev)),
			"refused":  structpb.NewStringValue(why),
		}}
	}
	if http {
		out.HttpResponse = &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
			Headers: verdictHeaders(resp.GetPolicy(), rev),
			Body:    "verdict: " + why + "\n",
		}}
	}
	return out
}

// checkMetadata is the dynamic metadata of an answer, for access logs
// (%DYNAMIC_METADATA(envoy.filters.http.ext_authz:policy)%): the decision,
// how each end resolved, and the audit (shadow) result when the decision has
// one — only here, never in the enforced answer.
func checkMetadata(r *verdictv1.DecideResponse) *structpb.Struct {
	str := structpb.NewStringValue
	side := func(s *verdictv1.SideDecision) *structpb.Value {
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"action": str(s.GetAction().String()),
			"policy": str(s.GetPolicy()),
			"scope":  str(s.GetScope()),
			"rule":   str(s.GetRule()),
			"reason": str(s.GetReason().String()),
		}})
	}
	resolution := func(e *verdictv1.EndpointResolution) *structpb.Value {
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"form":        str(e.GetForm().String()),
			"resolved_as": str(e.GetResolvedAs().String()),
			"workload":    str(e.GetWorkload()),
			"holders":     structpb.NewNumberValue(float64(e.GetHolders())),
			"identity":    str(strconv.FormatUint(e.GetIdentity(), 10)), // a uint64: a number would lose digits
		}})
	}
	m := map[string]*structpb.Value{
		"action":   str(r.GetAction().String()),
		"policy":   str(r.GetPolicy()),
		"revision": structpb.NewNumberValue(float64(r.GetRevision())),
		"outbound": side(r.GetOutbound()),
		"inbound":  side(r.GetInbound()),
	}
	if e := r.GetSourceResolution(); e != nil {
		m["source"] = resolution(e)
	}
	if e := r.GetDestinationResolution(); e != nil {
		m["destination"] = resolution(e)
	}
	if a := r.GetAudit(); a != nil {
		m["audit"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"action": str(a.GetAction().String()),
			"policy": str(a.GetPolicy()),
			"scope":  str(a.GetScope()),
			"rule":   str(a.GetRule()),
			"side":   str(a.GetSide()),
		}})
	}
	return &structpb.Struct{Fields: m}
}

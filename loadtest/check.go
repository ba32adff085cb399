package loadtest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/server"
)

// CheckFlows turns generated flows into what Envoy's ext_authz sees: one
// Workload per distinct tag set (an address from 10.128.0.0/9 and a SPIFFE ID
// each), and per flow the CheckRequest an HTTP filter sends over mTLS — the
// source by its certificate's URI SAN and address, the destination named by
// the route's context_extensions (verdict.workload, verdict.mesh,
// verdict.type), the port the connection came to, the request's headers (as
// server/envoycheck_test.go builds them, from Envoy's check_request_utils.cc).
func CheckFlows(flows []engine.Request) (workloads []resource.Resource, reqs []*authv3.CheckRequest) {
	byTags := map[string]*resource.Workload{}
	workload := func(mesh string, tags resource.Tags) *resource.Workload {
		keys := slices.Sorted(maps.Keys(tags))
		var b strings.Builder
		b.WriteString(mesh)
		for _, k := range keys {
			b.WriteString("\x00" + k + "\x00" + tags[k])
		}
		if w, ok := byTags[b.String()]; ok {
			return w
		}
		n := len(byTags)
		a := netip.AddrFrom4([4]byte{10, 128 | byte(n>>16), byte(n >> 8), byte(n)})
		name := fmt.Sprintf("w-%d", n)
		w := &resource.Workload{Mesh: mesh, Name: name, Tags: maps.Clone(tags), Addresses: []string{a.String()},
			Principal: "spiffe://" + mesh + "/" + name}
		byTags[b.String()] = w
		workloads = append(workloads, w)
		return w
	}
	for i, f := range flows {
		mesh, typ := f.Mesh, f.Type
		if mesh == "" {
			mesh = resource.DefaultMesh
		}
		src, dst := workload(mesh, f.Source), workload(mesh, f.Destination)
		port := f.Port
		if port == 0 {
			port = 8080
		}
		sock := func(addr string, port uint32) *corev3.Address {
			return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
		}
		ext := map[string]string{server.ExtAuthzWorkloadKey: dst.Name, server.ExtAuthzMeshKey: mesh}
		if typ != "" {
			ext[server.ExtAuthzTypeKey] = typ
		}
		headers := map[string]string{":method": "GET", ":authority": dst.Name + ":" + strconv.Itoa(int(port)),
			":path": "/api/items/" + strconv.Itoa(i), ":scheme": "https", "x-forwarded-proto": "https",
			"x-request-id": fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "user-agent": "verdict-loadtest", "accept": "*/*"}
		reqs = append(reqs, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source:      &authv3.AttributeContext_Peer{Address: sock(src.Addresses[0], 40000+uint32(i%20000)), Principal: src.Principal},
			Destination: &authv3.AttributeContext_Peer{Address: sock(dst.Addresses[0], port), Principal: dst.Principal},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Id: strconv.Itoa(i), Method: "GET", Path: headers[":path"], Host: headers[":authority"], Scheme: "https",
				Protocol: "HTTP/2", Headers: headers}},
			ContextExtensions:    ext,
			MetadataContext:      &corev3.Metadata{},
			RouteMetadataContext: &corev3.Metadata{},
		}})
	}
	return workloads, reqs
}

// Check runs Envoy's Authorization/Check: closed loop with concurrency
// workers ("check"), or open loop at rate calls per second when rate > 0
// ("check-open"). Each answer counts, allowed or denied: a Check's DENY is an
// answer, not an error.
func Check(ctx context.Context, conns Conns, reqs []*authv3.CheckRequest, concurrency int, rate float64, lim Limits) *Report {
	clients := make([]authv3.AuthorizationClient, len(conns))
	for i, c := range conns {
		clients[i] = authv3.NewAuthorizationClient(c)
	}
	fn := func(ctx context.Context, w int, i int64) (int, error) {
		_, err := clients[w%len(clients)].Check(ctx, reqs[i%int64(len(reqs))])
		return 1, err
	}
	if rate > 0 {
		return openLoop(ctx, "check-open", rate, concurrency, lim, fn)
	}
	return closedLoop(ctx, "check", concurrency, lim, fn)
}

// emptyAuthz answers every Check at once with a fixed OK shaped like
// verdict's (the two headers, the dynamic metadata of both sides): the
// ceiling of the check scenarios.
type emptyAuthz struct {
	authv3.UnimplementedAuthorizationServer
	resp *authv3.CheckResponse
}

func newEmptyAuthz() emptyAuthz {
	side := structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"action": structpb.NewStringValue("ACTION_ALLOW"), "policy": structpb.NewStringValue("p-004242-svc-17-to-svc-42"),
		"scope": structpb.NewStringValue(""), "rule": structpb.NewStringValue("sources[0]/destinations[0]"),
		"reason": structpb.NewStringValue("REASON_MATCHED")}})
	h := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	return emptyAuthz{resp: &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{
			h(server.HeaderPolicy, "p-004242-svc-17-to-svc-42"), h(server.HeaderRevision, "100042")}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"action": structpb.NewStringValue("ACTION_ALLOW"), "policy": structpb.NewStringValue("p-004242-svc-17-to-svc-42"),
			"revision": structpb.NewNumberValue(100042), "outbound": side, "inbound": side}},
	}}
}

func (e emptyAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return e.resp, nil
}

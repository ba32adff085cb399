package server

import (
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Connections as Envoy sees them: web (10.0.0.1, spiffe://default/web)
// calling backend's sidecar (10.0.0.2:8080, spiffe://default/backend).
var (
	mtlsConn = envoyConn{remote: "10.0.0.1:43122", local: "10.0.0.2:8080", tls: true,
		peerURISANs: []string{"spiffe://default/web"}, peerDNS: []string{"web.default.svc"}, peerSubject: "CN=web,O=default",
		localURISANs: []string{"spiffe://default/backend"}, localDNS: []string{"backend.default.svc"}, localSubject: "CN=backend",
		sni: "backend.default.svc"}
	plainConn = envoyConn{remote: "10.0.0.1:43122", local: "10.0.0.2:8080"}
)

func httpGet(ext map[string]string, extra ...string) envoyHTTP {
	return envoyHTTP{streamID: 9182736455463728190, protocol: "HTTP/1.1", bytesReceived: 0,
		start: time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC), contextExtensions: ext,
		headers: envoyRequestHeaders("GET", "backend:8080", "/api/v1/items?limit=10", extra...)}
}

func with(c envoyConn, edit func(*envoyConn)) envoyConn {
	edit(&c)
	return c
}

// mapCheck reads Envoy's requests as docs/envoy.md's table says, for both
// filters, with and without TLS.
func TestMapCheck(t *testing.T) {
	t.Parallel()
	addr := func(a string) *verdictv1.Endpoint { return &verdictv1.Endpoint{Address: a} }
	principal := func(p string) *verdictv1.Endpoint { return &verdictv1.Endpoint{Principal: p} }
	workload := func(w string) *verdictv1.Endpoint { return &verdictv1.Endpoint{Workload: w} }
	flow := func(mesh, typ string, src, dst *verdictv1.Endpoint, port uint32) *verdictv1.DecideRequest {
		return &verdictv1.DecideRequest{Mesh: mesh, Type: typ, Source: src, Destination: dst, Protocol: "TCP", Port: port}
	}
	internal := envoyTCPCheck(plainConn, envoyFilter{})
	internal.Attributes.Destination.Address = &corev3.Address{Address: &corev3.Address_EnvoyInternalAddress{
		EnvoyInternalAddress: &corev3.EnvoyInternalAddress{AddressNameSpecifier: &corev3.EnvoyInternalAddress_ServerListenerName{ServerListenerName: "inner"}}}}
	tests := []struct {
		name   string
		req    *authv3.CheckRequest
		want   *verdictv1.DecideRequest // nil: unmappable
		http   bool
		denial string
	}{
		{name: "HTTP plaintext: addresses", req: envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil)), http: true,
			want: flow("", "", addr("10.0.0.1"), addr("10.0.0.2"), 8080)},
		{name: "HTTP mTLS: URI SANs", req: envoyHTTPCheck(mtlsConn, envoyFilter{includeTLSSession: true}, httpGet(nil)), http: true,
			want: flow("", "", principal("spiffe://default/web"), principal("spiffe://default/backend"), 8080)},
		{name: "HTTP mTLS: DNS SAN without URI SAN", http: true,
			req:  envoyHTTPCheck(with(mtlsConn, func(c *envoyConn) { c.peerURISANs, c.localURISANs = nil, nil }), envoyFilter{}, httpGet(nil)),
			want: flow("", "", principal("web.default.svc"), principal("backend.default.svc"), 8080)},
		{name: "HTTP mTLS: subject without SANs", http: true,
			req: envoyHTTPCheck(with(mtlsConn, func(c *envoyConn) { c.peerURISANs, c.peerDNS = nil, nil }), envoyFilter{},
				httpGet(nil, "x-envoy-downstream-service-cluster", "web")),
			want: flow("", "", principal("CN=web,O=default"), principal("spiffe://default/backend"), 8080)},
		{name: "HTTP TLS without a client certificate: the source by address", http: true,
			req: envoyHTTPCheck(with(mtlsConn, func(c *envoyConn) { c.peerURISANs, c.peerDNS, c.peerSubject = nil, nil, "" }),
				envoyFilter{}, httpGet(nil)),
			want: flow("", "", addr("10.0.0.1"), principal("spiffe://default/backend"), 8080)},
		{name: "context_extensions name the workload, mesh and type", http: true,
			req: envoyHTTPCheck(mtlsConn, envoyFilter{labels: map[string]string{"verdict.workload": "other", "app": "x"}},
				httpGet(map[string]string{"verdict.workload": "backend-1", "verdict.mesh": "prod", "verdict.type": "MeshTrafficPermission"})),
			want: flow("prod", "MeshTrafficPermission", principal("spiffe://default/web"), workload("backend-1"), 8080)},
		{name: "labels name the workload and mesh (network filter)",
			req:  envoyTCPCheck(plainConn, envoyFilter{labels: map[string]string{"verdict.workload": "db-1", "verdict.mesh": "prod", "app": "db"}}),
			want: flow("prod", "", addr("10.0.0.1"), workload("db-1"), 8080)},
		{name: "context_extensions' mesh beats the labels'", http: true,
			req: envoyHTTPCheck(plainConn, envoyFilter{labels: map[string]string{"verdict.mesh": "a", "verdict.type": "T1"}},
				httpGet(map[string]string{"verdict.mesh": "b"})),
			want: flow("b", "T1", addr("10.0.0.1"), addr("10.0.0.2"), 8080)},
		{name: "other labels are the destination's tags (network filter, mTLS)",
			req: envoyTCPCheck(mtlsConn, envoyFilter{labels: map[string]string{"app": "db", "env": "prod", "verdict.mesh": "prod"}}),
			want: flow("prod", "", principal("spiffe://default/web"),
				&verdictv1.Endpoint{Tags: map[string]string{"app": "db", "env": "prod"}}, 8080)},
		{name: "labels with only the mesh: the destination by principal",
			req:  envoyTCPCheck(mtlsConn, envoyFilter{labels: map[string]string{"verdict.mesh": "prod"}, includeTLSSession: true}),
			want: flow("prod", "", principal("spiffe://default/web"), principal("spiffe://default/backend"), 8080)},
		{name: "IPv6 and IPv4-mapped addresses",
			req:  envoyTCPCheck(envoyConn{remote: "[::ffff:10.0.0.1]:5000", local: "[2001:db8::2]:443"}, envoyFilter{}),
			want: flow("", "", addr("10.0.0.1"), addr("2001:db8::2"), 443)},
		{name: "a Unix socket peer cannot be mapped", http: true,
			req:    envoyHTTPCheck(envoyConn{remote: "unix:/run/app.sock", local: "10.0.0.2:8080"}, envoyFilter{}, httpGet(nil)),
			denial: "source: neither a principal nor an IP socket address"},
		{name: "an internal listener's address cannot be mapped", req: internal,
			denial: "destination: neither a principal nor an IP socket address"},
		{name: "an empty request cannot be mapped", req: &authv3.CheckRequest{},
			denial: "destination: neither a principal nor an IP socket address"},
		{name: "an address that is no IP cannot be mapped", req: func() *authv3.CheckRequest {
			r := envoyTCPCheck(plainConn, envoyFilter{})
			r.Attributes.Source.Address.GetSocketAddress().Address = "web.local"
			return r
		}(), denial: `source: address "web.local" is not an IP address`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := mapCheck(tt.req)
			if got.http != tt.http {
				t.Errorf("http = %v, want %v", got.http, tt.http)
			}
			if got.denial != tt.denial {
				t.Errorf("denial %q, want %q", got.denial, tt.denial)
			}
			if !proto.Equal(got.req, tt.want) {
				t.Errorf("flow\n got %v\nwant %v", got.req, tt.want)
			}
		})
	}
}

func authzClient(h *harness) authv3.AuthorizationClient { return authv3.NewAuthorizationClient(h.conn) }

func header(hs []*corev3.HeaderValueOption, key string) (string, bool) {
	for _, h := range hs {
		if h.GetHeader().GetKey() == key {
			return h.GetHeader().GetValue(), true
		}
	}
	return "", false
}

// wantDenied checks a DENY as Envoy acts on it: PERMISSION_DENIED; for the
// HTTP filter a 403 whose body contains why; for the network filter no HTTP
// response at all.
func wantDenied(t *testing.T, resp *authv3.CheckResponse, http bool, why string) {
	t.Helper()
	if c := codes.Code(resp.GetStatus().GetCode()); c != codes.PermissionDenied {
		t.Fatalf("status %s (%q), want PermissionDenied", c, resp.GetStatus().GetMessage())
	}
	if !strings.Contains(resp.GetStatus().GetMessage(), why) {
		t.Errorf("status message %q does not say %q", resp.GetStatus().GetMessage(), why)
	}
	if resp.GetDynamicMetadata().GetFields()["action"].GetStringValue() != "ACTION_DENY" {
		t.Errorf("metadata %v: no action ACTION_DENY", resp.GetDynamicMetadata())
	}
	if !http {
		if resp.GetHttpResponse() != nil {
			t.Errorf("network filter's DENY has an HTTP response: %v", resp.GetHttpResponse())
		}
		return
	}
	d := resp.GetDeniedResponse()
	if d.GetStatus().GetCode() != typev3.StatusCode_Forbidden {
		t.Errorf("HTTP status %v, want 403", d.GetStatus())
	}
	if !strings.Contains(d.GetBody(), why) || strings.Count(d.GetBody(), "\n") != 1 {
		t.Errorf("body %q: want one line saying %q", d.GetBody(), why)
	}
	if _, ok := header(d.GetHeaders(), HeaderRevision); !ok {
		t.Errorf("no %s header: %v", HeaderRevision, d.GetHeaders())
	}
}

// A request verdict cannot decide for a reason of its own gets a DENY
// answer, never a gRPC error: Envoy lets a failed check through under
// failure_mode_allow, a DENY never.
func TestCheckRefusalsAreDenials(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	c := authzClient(h)
	ctx := ctxT(t)
	unix := envoyConn{remote: "unix:/run/app.sock", local: "10.0.0.2:8080"}
	tests := []struct {
		name string
		req  *authv3.CheckRequest
		http bool
		why  string
	}{
		{"HTTP from a Unix socket", envoyHTTPCheck(unix, envoyFilter{}, httpGet(nil)), true, "cannot be mapped to a flow: source"},
		{"network filter from a Unix socket", envoyTCPCheck(unix, envoyFilter{}), false, "cannot be mapped to a flow: source"},
		{"an empty request", &authv3.CheckRequest{}, false, "cannot be mapped to a flow: destination"},
		{"an unknown mesh", envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(map[string]string{"verdict.mesh": "nosuch"})), true, ""},
		{"an invalid type", envoyTCPCheck(plainConn, envoyFilter{labels: map[string]string{"verdict.type": "not a type!"}}), false, "type"},
		{"an unknown workload", envoyTCPCheck(plainConn, envoyFilter{labels: map[string]string{"verdict.workload": "nosuch"}}), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := c.Check(ctx, tt.req)
			if err != nil {
				t.Fatalf("a gRPC error (Envoy's failure_mode_allow could let it pass): %v", err)
			}
			wantDenied(t, resp, tt.http, tt.why)
		})
	}
	t.Run("undecodable", func(t *testing.T) {
		req := envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil, "x-bad", "@@@@"))
		var resp authv3.CheckResponse
		err := h.conn.Invoke(ctx, authv3.Authorization_Check_FullMethodName, corrupt(t, req), &resp, grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatalf("a gRPC error (Envoy's failure_mode_allow could let it pass): %v", err)
		}
		wantDenied(t, &resp, false, "cannot be mapped to a flow")
	})
}

// The audit (shadow) result goes in the dynamic metadata only: the status
// and the headers Envoy enforces are the enforced decision's.
func TestCheckAnswerKeepsAuditInMetadata(t *testing.T) {
	t.Parallel()
	resp := &verdictv1.DecideResponse{Action: verdictv1.Action_ACTION_ALLOW, Policy: "web-to-backend", Revision: 7,
		Inbound: &verdictv1.SideDecision{Action: verdictv1.Action_ACTION_ALLOW, Policy: "web-to-backend", Reason: verdictv1.Reason_REASON_MATCHED},
		Audit:   &verdictv1.Audit{Action: verdictv1.Action_ACTION_DENY, Policy: "shadow-deny", Rule: "from[0]", Side: "inbound"},
		DestinationResolution: &verdictv1.EndpointResolution{Form: verdictv1.EndpointForm_ENDPOINT_FORM_PRINCIPAL,
			ResolvedAs: verdictv1.ResolvedAs_RESOLVED_AS_PRINCIPAL_HOLDERS, Holders: 2, Identity: 1<<63 + 5}}
	out := allowedCheck(true, resp)
	if codes.Code(out.GetStatus().GetCode()) != codes.OK {
		t.Fatalf("status %v", out.GetStatus())
	}
	if p, _ := header(out.GetOkResponse().GetHeaders(), HeaderPolicy); p != "web-to-backend" {
		t.Errorf("%s = %q", HeaderPolicy, p)
	}
	if r, _ := header(out.GetOkResponse().GetHeaders(), HeaderRevision); r != "7" {
		t.Errorf("%s = %q", HeaderRevision, r)
	}
	if strings.Contains(out.GetOkResponse().String(), "shadow") {
		t.Errorf("the audit result leaks into the enforced answer: %v", out.GetOkResponse())
	}
	md := out.GetDynamicMetadata().GetFields()
	audit := md["audit"].GetStructValue().GetFields()
	if audit["action"].GetStringValue() != "ACTION_DENY" || audit["policy"].GetStringValue() != "shadow-deny" || audit["side"].GetStringValue() != "inbound" {
		t.Errorf("metadata audit %v", md["audit"])
	}
	dst := md["destination"].GetStructValue().GetFields()
	if dst["resolved_as"].GetStringValue() != "RESOLVED_AS_PRINCIPAL_HOLDERS" || dst["identity"].GetStringValue() != "9223372036854775813" {
		t.Errorf("metadata destination %v", md["destination"])
	}
	if _, ok := md["source"]; ok {
		t.Errorf("a source resolution from nothing: %v", md["source"])
	}
	if _, ok := allowedCheck(false, resp).GetDynamicMetadata().GetFields()["audit"]; !ok {
		t.Errorf("the network filter's answer lost the audit")
	}
}

// --disable-ext-authz: the service is not served.
func TestCheckDisabled(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.DisableExtAuthz = true })
	_, err := authzClient(h).Check(ctxT(t), envoyTCPCheck(plainConn, envoyFilter{}))
	wantCode(t, err, codes.Unimplemented)
}

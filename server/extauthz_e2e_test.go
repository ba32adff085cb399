package server

import (
	"strconv"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The inventory and policies of the end-to-end test: a mesh that denies what
// no policy concerns (unknown peers fail closed), web → backend allowed on
// 8080, every app denied to db, and the partner network allowed to backend's
// public port by CIDR (an unknown address decided, not refused); an audit
// policy would deny web → backend (a shadow result only).
const checkResources = `
kind: Mesh
name: default
unenforcedAction: DENY
---
kind: Workload
name: web-1
tags: {app: web, env: prod}
addresses: [10.0.0.1]
principal: spiffe://default/web
---
kind: Workload
name: backend-1
tags: {app: backend, env: prod}
addresses: [10.0.0.2]
principal: spiffe://default/backend
ports: [{port: 8080, tags: {kuma.io/protocol: http}}]
---
kind: Workload
name: db-1
tags: {app: db}
addresses: [10.0.0.3]
principal: spiffe://default/db
---
kind: Policy
name: web-to-backend
sources: [{match: {app: web}}]
destinations: [{match: {app: backend}}]
ports: [{protocol: TCP, ports: "8080"}]
---
kind: Policy
name: deny-db
sources: [{match: {app: '*'}}]
destinations: [{match: {app: db}}]
action: DENY
---
kind: Policy
name: audit-web-to-backend
mode: Audit
sources: [{match: {app: web, env: prod}}]
destinations: [{match: {app: backend, env: prod}}]
action: DENY
---
kind: Policy
name: partners-to-backend
sources: [{expressions: [{key: ip, operator: CIDR, values: [203.0.113.0/24]}]}]
destinations: [{match: {app: backend}}]
ports: [{protocol: TCP, ports: "8443"}]
`

// Check answers Envoy's requests — HTTP and network filter, mTLS and
// plaintext — exactly as Decide answers the same flow, over a real gRPC
// connection with the generated clients: the same action and deciding
// policy at the same revision, the headers and the metadata Envoy acts on.
func TestCheckAsDecide(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, checkResources)...), nil)
	ctx := ctxT(t)
	authz := authzClient(h)
	dbConn := with(mtlsConn, func(c *envoyConn) {
		c.local, c.localURISANs, c.sni = "10.0.0.3:5432", []string{"spiffe://default/db"}, "db.default.svc"
	})
	partner := envoyConn{remote: "203.0.113.9:50122", local: "10.0.0.2:8443"}
	stranger := envoyConn{remote: "192.0.2.7:50122", local: "10.0.0.2:8080"}
	ep := func(form, v string) *verdictv1.Endpoint {
		switch form {
		case "principal":
			return &verdictv1.Endpoint{Principal: v}
		case "workload":
			return &verdictv1.Endpoint{Workload: v}
		}
		return &verdictv1.Endpoint{Address: v}
	}
	tests := []struct {
		name   string
		check  *authv3.CheckRequest
		http   bool
		flow   *verdictv1.DecideRequest // the same flow asked of Decide
		allow  bool
		policy string
		audit  string // the audit policy of a shadow result that differs
	}{
		{name: "HTTP mTLS web to backend: allowed, the audit DENY in metadata only", http: true, allow: true,
			policy: "web-to-backend", audit: "audit-web-to-backend",
			check: envoyHTTPCheck(mtlsConn, envoyFilter{}, httpGet(nil)),
			flow: &verdictv1.DecideRequest{Source: ep("principal", "spiffe://default/web"),
				Destination: ep("principal", "spiffe://default/backend"), Protocol: "TCP", Port: 8080}},
		{name: "HTTP plaintext web to backend by address: allowed", http: true, allow: true, policy: "web-to-backend",
			audit: "audit-web-to-backend",
			check: envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil)),
			flow:  &verdictv1.DecideRequest{Source: ep("address", "10.0.0.1"), Destination: ep("address", "10.0.0.2"), Protocol: "TCP", Port: 8080}},
		{name: "HTTP mTLS, the route names the workload: allowed", http: true, allow: true, policy: "web-to-backend",
			audit: "audit-web-to-backend",
			check: envoyHTTPCheck(mtlsConn, envoyFilter{}, httpGet(map[string]string{ExtAuthzWorkloadKey: "backend-1"})),
			flow: &verdictv1.DecideRequest{Source: ep("principal", "spiffe://default/web"), Destination: ep("workload", "backend-1"),
				Protocol: "TCP", Port: 8080}},
		{name: "HTTP to a port no policy allows: denied", http: true,
			check: envoyHTTPCheck(with(plainConn, func(c *envoyConn) { c.local = "10.0.0.2:9090" }), envoyFilter{}, httpGet(nil)),
			flow:  &verdictv1.DecideRequest{Source: ep("address", "10.0.0.1"), Destination: ep("address", "10.0.0.2"), Protocol: "TCP", Port: 9090}},
		{name: "network filter mTLS to db, labels name the workload: denied", policy: "deny-db",
			check: envoyTCPCheck(dbConn, envoyFilter{labels: map[string]string{ExtAuthzWorkloadKey: "db-1"}, includeTLSSession: true}),
			flow: &verdictv1.DecideRequest{Source: ep("principal", "spiffe://default/web"), Destination: ep("workload", "db-1"),
				Protocol: "TCP", Port: 5432}},
		{name: "network filter plaintext to db by address: denied", policy: "deny-db",
			check: envoyTCPCheck(with(plainConn, func(c *envoyConn) { c.local = "10.0.0.3:5432" }), envoyFilter{}),
			flow:  &verdictv1.DecideRequest{Source: ep("address", "10.0.0.1"), Destination: ep("address", "10.0.0.3"), Protocol: "TCP", Port: 5432}},
		{name: "network filter from an unknown address: denied (fails closed)",
			check: envoyTCPCheck(stranger, envoyFilter{}),
			flow:  &verdictv1.DecideRequest{Source: ep("address", "192.0.2.7"), Destination: ep("address", "10.0.0.2"), Protocol: "TCP", Port: 8080}},
		{name: "HTTP from an unknown principal: denied (fails closed)", http: true,
			check: envoyHTTPCheck(with(mtlsConn, func(c *envoyConn) { c.peerURISANs = []string{"spiffe://elsewhere/intruder"} }), envoyFilter{}, httpGet(nil)),
			flow: &verdictv1.DecideRequest{Source: ep("principal", "spiffe://elsewhere/intruder"),
				Destination: ep("principal", "spiffe://default/backend"), Protocol: "TCP", Port: 8080}},
		{name: "network filter from the partner network: allowed by CIDR", allow: true, policy: "partners-to-backend",
			check: envoyTCPCheck(partner, envoyFilter{}),
			flow:  &verdictv1.DecideRequest{Source: ep("address", "203.0.113.9"), Destination: ep("address", "10.0.0.2"), Protocol: "TCP", Port: 8443}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := h.dec.Decide(ctx, tt.flow)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if (want.GetAction() == verdictv1.Action_ACTION_ALLOW) != tt.allow || want.GetPolicy() != tt.policy ||
				want.GetAudit().GetPolicy() != tt.audit {
				t.Fatalf("the test's premise: Decide says %s by %q, audit %v", want.GetAction(), want.GetPolicy(), want.GetAudit())
			}
			got, err := authz.Check(ctx, tt.check)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			checkMatchesDecide(t, got, want, tt.http)
		})
	}
}

// checkMatchesDecide: Check's answer is Decide's, as Envoy reads it.
func checkMatchesDecide(t *testing.T, got *authv3.CheckResponse, want *verdictv1.DecideResponse, http bool) {
	t.Helper()
	md := got.GetDynamicMetadata().GetFields()
	if md["action"].GetStringValue() != want.GetAction().String() || md["policy"].GetStringValue() != want.GetPolicy() ||
		int64(md["revision"].GetNumberValue()) != want.GetRevision() {
		t.Errorf("metadata %v, Decide %s by %q at %d", got.GetDynamicMetadata(), want.GetAction(), want.GetPolicy(), want.GetRevision())
	}
	for side, r := range map[string]*verdictv1.EndpointResolution{"source": want.GetSourceResolution(), "destination": want.GetDestinationResolution()} {
		if r == nil {
			continue
		}
		if md[side].GetStructValue().GetFields()["resolved_as"].GetStringValue() != r.GetResolvedAs().String() {
			t.Errorf("metadata %s %v, Decide resolved it as %s", side, md[side], r.GetResolvedAs())
		}
	}
	audit := md["audit"].GetStructValue().GetFields()
	if a := want.GetAudit(); (a == nil) != (md["audit"] == nil) ||
		a != nil && (a.GetPolicy() != audit["policy"].GetStringValue() || a.GetAction().String() != audit["action"].GetStringValue()) {
		t.Errorf("metadata audit %v, Decide's %v", md["audit"], a)
	}
	if want.GetAction() != verdictv1.Action_ACTION_ALLOW {
		why := "denied"
		if want.GetPolicy() != "" {
			why = "denied by policy " + want.GetPolicy()
		}
		wantDenied(t, got, http, why)
		if http {
			if p, _ := header(got.GetDeniedResponse().GetHeaders(), HeaderPolicy); p != want.GetPolicy() {
				t.Errorf("%s = %q, want %q", HeaderPolicy, p, want.GetPolicy())
			}
		}
		return
	}
	if c := codes.Code(got.GetStatus().GetCode()); c != codes.OK {
		t.Fatalf("status %s (%q), Decide allows", c, got.GetStatus().GetMessage())
	}
	if !http {
		if got.GetHttpResponse() != nil {
			t.Errorf("network filter's OK has an HTTP response: %v", got.GetHttpResponse())
		}
		return
	}
	hs := got.GetOkResponse().GetHeaders()
	if p, _ := header(hs, HeaderPolicy); p != want.GetPolicy() {
		t.Errorf("%s = %q, want %q", HeaderPolicy, p, want.GetPolicy())
	}
	if r, _ := header(hs, HeaderRevision); r != strconv.FormatInt(want.GetRevision(), 10) {
		t.Errorf("%s = %q, want %d", HeaderRevision, r, want.GetRevision())
	}
}

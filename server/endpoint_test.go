package server

import (
	"errors"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// testWorkloads are the inventory of the endpoint tests, beside testPolicies.
const testWorkloads = `
---
kind: Workload
name: web-1
tags: {app: web}
addresses: [10.0.0.1]
principal: spiffe://default/web
---
kind: Workload
name: backend-1
tags: {app: backend}
addresses: [10.0.0.2, "2001:db8::2"]
ports: [{port: 8080, tags: {tier: api}}]
---
kind: Workload
name: db-1
tags: {app: db}
addresses: [10.0.0.3]
`

func startWithWorkloads(t *testing.T) *harness {
	t.Helper()
	return start(t, newBackend(decodeYAML(t, testPolicies+testWorkloads)...), nil)
}

// wantResolution is the report expected: identity is that of own, tags are
// given only with explain.
func wantResolution(form verdictv1.EndpointForm, as verdictv1.ResolvedAs, workload string, holders uint32, own, tags map[string]string) *verdictv1.EndpointResolution {
	return &verdictv1.EndpointResolution{Form: form, ResolvedAs: as, Workload: workload, Holders: holders,
		Identity: resource.Identity("default", own), Tags: tags}
}

func sameResolution(a, b *verdictv1.EndpointResolution) bool {
	return a.GetForm() == b.GetForm() && a.GetResolvedAs() == b.GetResolvedAs() && a.GetWorkload() == b.GetWorkload() &&
		a.GetHolders() == b.GetHolders() && a.GetIdentity() == b.GetIdentity() && maps.Equal(a.GetTags(), b.GetTags())
}

// Decide takes every endpoint form, answers as the tags they resolve to, and
// says how each end was resolved (the tags only with explain).
func TestDecideEndpointForms(t *testing.T) {
	t.Parallel()
	h := startWithWorkloads(t)
	ctx := ctxT(t)
	const (
		form = verdictv1.EndpointForm_ENDPOINT_FORM_TAGS
		byWl = verdictv1.EndpointForm_ENDPOINT_FORM_WORKLOAD
		byAd = verdictv1.EndpointForm_ENDPOINT_FORM_ADDRESS
		byPr = verdictv1.EndpointForm_ENDPOINT_FORM_PRINCIPAL
		byID = verdictv1.EndpointForm_ENDPOINT_FORM_IDENTITY
	)
	dbID := resource.Identity("default", map[string]string{"app": "db"})
	cases := []struct {
		name     string
		src, dst *verdictv1.Endpoint
		explain  bool
		action   verdictv1.Action
		policy   string
		srcRes   *verdictv1.EndpointResolution
		dstRes   *verdictv1.EndpointResolution
	}{
		{name: "tags", src: tags("app", "web"), dst: tags("app", "backend"), action: verdictv1.Action_ACTION_ALLOW, policy: "web-to-backend",
			srcRes: wantResolution(form, verdictv1.ResolvedAs_RESOLVED_AS_TAGS, "", 0, map[string]string{"app": "web"}, nil),
			dstRes: wantResolution(form, verdictv1.ResolvedAs_RESOLVED_AS_TAGS, "", 0, map[string]string{"app": "backend"}, nil)},
		{name: "workload to address", src: &verdictv1.Endpoint{Workload: "web-1"}, dst: &verdictv1.Endpoint{Address: "10.0.0.2"},
			action: verdictv1.Action_ACTION_ALLOW, policy: "web-to-backend",
			srcRes: wantResolution(byWl, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "web-1", 0, map[string]string{"app": "web"}, nil),
			dstRes: wantResolution(byAd, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "backend-1", 0, map[string]string{"app": "backend", "tier": "api"}, nil)},
		{name: "explain gives the resolved tags, port tags and ip included", src: &verdictv1.Endpoint{Workload: "web-1"},
			dst: &verdictv1.Endpoint{Address: "2001:DB8::2"}, explain: true, action: verdictv1.Action_ACTION_ALLOW, policy: "web-to-backend",
			srcRes: wantResolution(byWl, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "web-1", 0, map[string]string{"app": "web"}, map[string]string{"app": "web"}),
			dstRes: wantResolution(byAd, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "backend-1", 0, map[string]string{"app": "backend", "tier": "api"},
				map[string]string{"app": "backend", "tier": "api", "ip": "2001:db8::2"})},
		{name: "principal to identity", src: &verdictv1.Endpoint{Principal: "spiffe://default/web"}, dst: &verdictv1.Endpoint{Identity: dbID},
			explain: true, action: verdictv1.Action_ACTION_DENY, policy: "deny-db",
			srcRes: wantResolution(byPr, verdictv1.ResolvedAs_RESOLVED_AS_PRINCIPAL_HOLDERS, "", 1, map[string]string{"app": "web"},
				map[string]string{"app": "web", "principal": "spiffe://default/web"}),
			dstRes: wantResolution(byID, verdictv1.ResolvedAs_RESOLVED_AS_IDENTITY, "", 0, map[string]string{"app": "db"}, map[string]string{"app": "db"})},
		{name: "an unknown address is external", src: &verdictv1.Endpoint{Workload: "web-1"}, dst: &verdictv1.Endpoint{Address: "10.9.9.9"},
			explain: true, action: verdictv1.Action_ACTION_DENY, // no rule matches {ip}: the default action
			srcRes: wantResolution(byWl, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "web-1", 0, map[string]string{"app": "web"}, map[string]string{"app": "web"}),
			dstRes: wantResolution(byAd, verdictv1.ResolvedAs_RESOLVED_AS_EXTERNAL, "", 0, nil, map[string]string{"ip": "10.9.9.9"})},
		{name: "a Kuma SPIFFE ID no workload holds", src: &verdictv1.Endpoint{Principal: "spiffe://default/web-2"},
			dst: &verdictv1.Endpoint{Workload: "db-1"}, action: verdictv1.Action_ACTION_DENY, // no app tag: deny-db does not match
			srcRes: wantResolution(byPr, verdictv1.ResolvedAs_RESOLVED_AS_KUMA_SPIFFE, "", 0, map[string]string{"kuma.io/service": "web-2"}, nil),
			dstRes: wantResolution(byWl, verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, "db-1", 0, map[string]string{"app": "db"}, nil)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			resp, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: c.src, Destination: c.dst, Protocol: "TCP", Port: 8080,
				Explain: c.explain})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAction() != c.action || resp.GetPolicy() != c.policy {
				t.Fatalf("%v by %q, want %v by %q", resp.GetAction(), resp.GetPolicy(), c.action, c.policy)
			}
			if !sameResolution(resp.GetSourceResolution(), c.srcRes) || !sameResolution(resp.GetDestinationResolution(), c.dstRes) {
				t.Fatalf("resolutions\n got %v / %v\nwant %v / %v", resp.GetSourceResolution(), resp.GetDestinationResolution(), c.srcRes, c.dstRes)
			}
		})
	}
}

func TestDecideEndpointErrors(t *testing.T) {
	t.Parallel()
	h := startWithWorkloads(t)
	ctx := ctxT(t)
	_, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "nope"}})
	wantCode(t, err, codes.NotFound)
	_, err = h.dec.Decide(ctx, &verdictv1.DecideRequest{Destination: &verdictv1.Endpoint{Identity: 42}})
	wantCode(t, err, codes.NotFound)
	_, err = h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "web-1", Address: "10.0.0.1"},
		Destination: &verdictv1.Endpoint{Address: "10.0.0.300"}})
	v := violations(wantCode(t, err, codes.InvalidArgument))
	if !strings.Contains(v["source.address"], "exactly one") || !strings.Contains(v["destination.address"], "not an IP address") || len(v) != 2 {
		t.Fatalf("violations %v", v)
	}
	_, err = h.dec.Resolve(ctx, &verdictv1.ResolveRequest{Type: "TrafficLog", Source: &verdictv1.Endpoint{Workload: "web-1", Principal: "p"}})
	if v := violations(wantCode(t, err, codes.InvalidArgument)); v["source.principal"] == "" {
		t.Fatalf("violations %v", v)
	}
}

// In a batch or a stream, an unknown workload or identity is the error of its
// flow alone.
func TestBatchAndStreamEndpointForms(t *testing.T) {
	t.Parallel()
	h := startWithWorkloads(t)
	ctx := ctxT(t)
	good := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "10.0.0.1"}, Destination: &verdictv1.Endpoint{Workload: "db-1"}}
	unknown := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "nope"}}
	bad := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "nope"}}
	out, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{good, unknown, bad}})
	if err != nil {
		t.Fatal(err)
	}
	rs := out.GetResults()
	if rs[0].GetResponse().GetAction() != verdictv1.Action_ACTION_DENY ||
		rs[0].GetResponse().GetSourceResolution().GetWorkload() != "web-1" {
		t.Fatalf("results[0] %v", rs[0])
	}
	if rs[1].GetError().GetCode() != "NotFound" {
		t.Fatalf("results[1] %v", rs[1])
	}
	if e := rs[2].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) != 1 ||
		e.GetFieldViolations()[0].GetField() != "requests[2].source.address" {
		t.Fatalf("results[2] %v", rs[2])
	}

	stream, err := h.dec.DecideStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []*verdictv1.DecideRequest{good, {Destination: &verdictv1.Endpoint{Identity: 7}}} {
		if err := stream.Send(&verdictv1.DecideStreamRequest{Id: string(rune('a' + i)), Request: r}); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := map[string]*verdictv1.DecideResult{}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[m.GetId()] = m.GetResult()
	}
	if got["a"].GetResponse().GetDestinationResolution().GetWorkload() != "db-1" || got["b"].GetError().GetCode() != "NotFound" {
		t.Fatalf("stream answers %v", got)
	}
}

func TestResolveEndpointForms(t *testing.T) {
	t.Parallel()
	h := startWithWorkloads(t)
	ctx := ctxT(t)
	resp, err := h.dec.Resolve(ctx, &verdictv1.ResolveRequest{Type: "TrafficLog", Source: &verdictv1.Endpoint{Principal: "spiffe://default/web"},
		Destination: &verdictv1.Endpoint{Address: "10.0.0.2"}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range resp.GetRules() {
		if r.GetName() == "backend" && r.GetValue().GetStringValue() == "splunk" {
			found = true
		}
	}
	if !found {
		t.Fatalf("rules %v", resp.GetRules())
	}
	_, err = h.dec.Resolve(ctx, &verdictv1.ResolveRequest{Type: "TrafficLog", Source: &verdictv1.Endpoint{Workload: "nope"},
		Destination: tags("app", "db")})
	wantCode(t, err, codes.NotFound)
}

// The decision log records each end as the request gave it, with the tags it
// was decided on.
func TestDecisionLogRecordsEndpointForms(t *testing.T) {
	h, buf := startLogged(t, decisionlog.Denies, "")
	ctx := ctxT(t)
	var puts []*verdictv1.Resource
	for _, r := range decodeYAML(t, strings.TrimPrefix(testWorkloads, "\n---")) {
		w := r.(*resource.Workload)
		puts = append(puts, &verdictv1.Resource{Resource: &verdictv1.Resource_Workload{Workload: &verdictv1.Workload{
			Name: w.Name, Tags: w.Tags, Addresses: w.Addresses, Principal: w.Principal}}})
	}
	ap, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: puts})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Principal: "spiffe://default/web"},
		Destination: &verdictv1.Endpoint{Address: "10.0.0.3"}, MinRevision: ap.GetRevision()}); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for deadline := time.Now().Add(time.Minute); len(lines) < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		lines = buf.lines()
	}
	if len(lines) != 1 {
		t.Fatalf("%d records", len(lines))
	}
	r := parseRecord(t, lines[0])
	if r.Source.Principal != "spiffe://default/web" || r.Source.Tags["app"] != "web" || r.Destination.Address != "10.0.0.3" ||
		r.Destination.Tags["ip"] != "10.0.0.3" || r.Destination.Tags["app"] != "db" || r.Destination.Workload != "" {
		t.Fatalf("record endpoints %+v / %+v", r.Source, r.Destination)
	}
}

// An identity registered through Identify names an endpoint of Decide.
func TestDecideByRegisteredIdentity(t *testing.T) {
	t.Parallel()
	h := startWithWorkloads(t)
	ctx := ctxT(t)
	reg, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{tags("app", "web", "team", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	id := reg.GetResults()[0].GetIdentity()
	if id != resource.Identity("default", map[string]string{"app": "web", "team": "x"}) {
		t.Fatalf("identity %d", id)
	}
	resp, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Identity: id},
		Destination: &verdictv1.Endpoint{Workload: "backend-1"}, Protocol: "TCP", Port: 8080, Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAction() != verdictv1.Action_ACTION_ALLOW || resp.GetSourceResolution().GetTags()["team"] != "x" {
		t.Fatalf("decided %v, resolved %v", resp.GetAction(), resp.GetSourceResolution())
	}
}

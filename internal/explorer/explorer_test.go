package explorer_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/test/bufconn"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/explorer"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/syncer"
)

const shop = `
kind: Mesh
name: shop
defaultAction: DENY
---
kind: Workload
mesh: shop
name: web-1
tags: {app: web}
addresses: [10.1.0.1]
---
kind: Workload
mesh: shop
name: db-1
tags: {app: db}
addresses: [10.1.0.2]
---
kind: Policy
mesh: shop
name: web-to-db
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
`

// serve runs the real server over an in-memory store holding shop, and the
// explorer's handler in front of its in-process connection.
func serve(t *testing.T, token string) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := memory.New(memory.Config{})
	rs, err := resource.DecodeYAML([]byte(shop))
	if err != nil {
		t.Fatal(err)
	}
	ops := make([]store.Op, len(rs))
	for i, r := range rs {
		ops[i] = store.Op{Key: r.Key(), Resource: r}
	}
	rev, err := st.Apply(ctx, ops)
	if err != nil {
		t.Fatal(err)
	}
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	syncDone := make(chan struct{})
	go func() { defer close(syncDone); _ = sy.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := sy.WaitFor(wctx, rev); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Syncer: sy, Store: st, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan struct{})
	go func() { defer close(serveDone); _ = srv.Serve(ctx, bufconn.Listen(1<<16)) }()
	conn, err := srv.InProcess("explorer")
	if err != nil {
		t.Fatal(err)
	}
	h, err := explorer.New(explorer.Config{Conn: conn, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.Close()
		conn.Close()
		cancel()
		<-serveDone
		<-syncDone
		st.Close()
	})
	return hs
}

type call struct {
	name    string
	method  string
	path    string
	body    string
	headers map[string]string
	host    string
	code    int
	want    []string // parts of the body
	pages   string   // the Verdict-Pages header, when set
}

func (c call) run(t *testing.T, base string) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	if c.method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	if c.host != "" {
		req.Host = c.host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != c.code {
		t.Errorf("%d %s, want %d", resp.StatusCode, body, c.code)
	}
	if c.pages != "" && resp.Header.Get("Verdict-Pages") != c.pages {
		t.Errorf("Verdict-Pages %q, want %q", resp.Header.Get("Verdict-Pages"), c.pages)
	}
	for _, w := range c.want {
		if !strings.Contains(string(body), w) {
			t.Errorf("body %s lacks %q", body, w)
		}
	}
}

const flow = `{"mesh":"shop","source":{"workload":"web-1"},"destination":{"address":"10.1.0.2"},"protocol":"TCP","port":5432,"explain":true}`

func TestGateway(t *testing.T) {
	t.Parallel()
	hs := serve(t, "")
	tests := []call{
		{name: "decide with explain", method: "POST", path: "/api/verdict.v1.DecisionService/Decide", body: flow, code: 200,
			want: []string{`"action":"ACTION_ALLOW"`, `"policy":"web-to-db"`, `"candidates":[`, `"workload":"db-1"`}},
		{name: "64-bit integers are strings", method: "POST", path: "/api/verdict.v1.DecisionService/Decide", body: flow, code: 200,
			want: []string{`"revision":"`, `"identity":"`}},
		{name: "an unknown workload", method: "POST", path: "/api/verdict.v1.DecisionService/Decide",
			body: `{"mesh":"shop","source":{"workload":"nobody"},"destination":{"workload":"db-1"}}`, code: 404,
			want: []string{`"code":5`, `nobody`}},
		{name: "field violations", method: "POST", path: "/api/verdict.v1.DecisionService/Decide",
			body: `{"mesh":"shop","source":{"workload":"web-1","address":"10.1.0.1"},"destination":{"workload":"db-1"}}`, code: 400,
			want: []string{`"code":3`, `"fieldViolations"`, `type.googleapis.com/google.rpc.BadRequest`}},
		{name: "a body that is not the request", method: "POST", path: "/api/verdict.v1.DecisionService/Decide",
			body: `{"nope":1}`, code: 400, want: []string{`request body`}},
		{name: "an empty body is the empty request", method: "POST", path: "/api/verdict.v1.PolicyService/Status", code: 200,
			want: []string{`"synced":true`}},
		{name: "the first message of WatchRules", method: "POST", path: "/api/verdict.v1.WatchService/WatchRules",
			body: `{"mesh":"shop","workload":{"workload":"db-1"}}`, code: 200,
			want: []string{`"kind":"WATCH_RULES_KIND_RULES"`, `"policy":"web-to-db"`}},
		{name: "a workload", method: "POST", path: "/api/verdict.v1.PolicyService/Get", body: `{"key":"shop/workloads/web-1"}`, code: 200,
			want: []string{`"addresses":["10.1.0.1"]`}},
		{name: "a write is not the explorer's", method: "POST", path: "/api/verdict.v1.PolicyService/Apply", body: `{}`, code: 404},
		{name: "a client stream is not the explorer's", method: "POST", path: "/api/verdict.v1.DecisionService/DecideStream", body: `{}`, code: 404},
		{name: "an unknown service", method: "POST", path: "/api/nope.Service/Decide", body: `{}`, code: 404},
		{name: "not JSON", method: "POST", path: "/api/verdict.v1.PolicyService/Status", body: `{}`,
			headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, code: 400},
		{name: "GET of the API", method: "GET", path: "/api/verdict.v1.PolicyService/Status", code: 405},
		{name: "the page, whatever the query", method: "GET", path: "/?mesh=shop&src=workload:web-1", code: 200,
			want: []string{`<main id="main"`}},
		{name: "a view module", method: "GET", path: "/views/decide.js", code: 200, want: []string{"export default"}},
		{name: "no listing", method: "GET", path: "/views/", code: 404},
		{name: "POST of the page", method: "POST", path: "/", code: 405},
		{name: "another host", method: "GET", path: "/", host: "rebound.example:8080", code: 421},
		{name: "another host, trailing dot", method: "GET", path: "/", host: "rebound.example.", code: 421},
		{name: "localhost", method: "GET", path: "/", host: "localhost:1234", code: 200},
		{name: "IPv6 loopback", method: "GET", path: "/", host: "[::1]:1234", code: 200},
		{name: "cross-origin", method: "POST", path: "/api/verdict.v1.PolicyService/Status", body: `{}`,
			headers: map[string]string{"Origin": "http://evil.example"}, code: 403},
		{name: "cross-site", method: "POST", path: "/api/verdict.v1.PolicyService/Status", body: `{}`,
			headers: map[string]string{"Sec-Fetch-Site": "cross-site"}, code: 403},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, hs.URL) })
	}
}

// The analysis and history methods, pasted documents, and Reach read in
// pages: the Verdict-Pages header counts them, ?page=N picks one.
func TestGatewayAnalysis(t *testing.T) {
	t.Parallel()
	hs := serve(t, "")
	reach := `{"mesh":"shop","endpoint":{"workload":"db-1"},"direction":"REACH_DIRECTION_TO","protocol":"TCP","port":5432}`
	freeze := `{"resources":[{"policy":{"mesh":"shop","name":"freeze","priority":-1,"sources":[{"match":{"app":"web"}}],` +
		`"destinations":[{"match":{"app":"db"}}],"action":"DENY"}}]}`
	tests := []call{
		{name: "reach, the first page", method: "POST", path: "/api/verdict.v1.AnalysisService/Reach", body: reach, code: 200,
			want: []string{`"workload":"web-1"`, `"outboundPolicy":"web-to-db"`}, pages: "1"},
		{name: "reach, page 0", method: "POST", path: "/api/verdict.v1.AnalysisService/Reach?page=0", body: reach, code: 200,
			want: []string{`"workload":"web-1"`}, pages: "1"},
		{name: "reach, a page past the last", method: "POST", path: "/api/verdict.v1.AnalysisService/Reach?page=1", body: reach, code: 404,
			want: []string{"the answer has 1 page(s)"}},
		{name: "reach, not a page", method: "POST", path: "/api/verdict.v1.AnalysisService/Reach?page=-1", body: reach, code: 400},
		{name: "reach, the method table's validation", method: "POST", path: "/api/verdict.v1.AnalysisService/Reach",
			body: `{"mesh":"shop","endpoint":{"workload":"db-1","address":"10.1.0.2"}}`, code: 400, want: []string{`"fieldViolations"`}},
		{name: "impact, nothing written", method: "POST", path: "/api/verdict.v1.AnalysisService/Impact", body: freeze, code: 200,
			want: []string{`"policy":"freeze"`, `"policy":"web-to-db"`, `"considered":"32"`}},
		{name: "lint", method: "POST", path: "/api/verdict.v1.AnalysisService/Lint", body: `{"mesh":"shop"}`, code: 200,
			want: []string{`"rules":"1"`}},
		{name: "documents", method: "POST", path: "/api/documents",
			body: `{"yaml":"kind: Policy\nmesh: shop\nname: freeze\nsources: [{match: {app: web}}]\ndestinations: [{}]\naction: DENY\n---\nkind: Workload\nmesh: shop\nname: w\n"}`,
			code: 200, want: []string{`{"resources":[{"policy":{"kind":"Policy","mesh":"shop","name":"freeze"`, `{"workload":{"kind":"Workload"`}},
		{name: "documents that do not decode", method: "POST", path: "/api/documents",
			body: `{"yaml":"kind: Policy\nname: x\nsources: [{mtch: {}}]\ndestinations: [{}]\naction: DENI\n"}`, code: 400,
			want: []string{`"code":3`, `"field":"documents[0] (line 1).sources[0].mtch"`, `"field":"documents[0] (line 1).action"`}},
		{name: "YAML that does not parse", method: "POST", path: "/api/documents", body: `{"yaml":"a: [b"}`, code: 400,
			want: []string{`YAML`}},
		{name: "no document", method: "POST", path: "/api/documents", body: `{"yaml":"# nothing\n"}`, code: 400,
			want: []string{`no document`}},
		{name: "documents, not the request", method: "POST", path: "/api/documents", body: `{"yaml":1}`, code: 400},
		{name: "documents, not JSON", method: "POST", path: "/api/documents", body: `kind: Policy`,
			headers: map[string]string{"Content-Type": "application/yaml"}, code: 400},
		{name: "documents, GET", method: "GET", path: "/api/documents", code: 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, hs.URL) })
	}
}

// With a token, every API call needs it, open RPCs included; the page's
// files do not (they hold no data).
func TestGatewayToken(t *testing.T) {
	t.Parallel()
	hs := serve(t, "s3cret")
	bearer := map[string]string{"Authorization": "Bearer s3cret"}
	tests := []call{
		{name: "the page", method: "GET", path: "/", code: 200},
		{name: "decide, no token", method: "POST", path: "/api/verdict.v1.DecisionService/Decide",
			body: `{"mesh":"shop","source":{"workload":"web-1"},"destination":{"workload":"db-1"}}`, code: 401,
			want: []string{`"code":16`}},
		{name: "decide, a wrong token", method: "POST", path: "/api/verdict.v1.DecisionService/Decide", body: flow,
			headers: map[string]string{"Authorization": "Bearer nope"}, code: 401},
		{name: "decide, not bearer", method: "POST", path: "/api/verdict.v1.DecisionService/Decide", body: flow,
			headers: map[string]string{"Authorization": "Basic czNjcmV0"}, code: 401},
		{name: "decide, the token", method: "POST", path: "/api/verdict.v1.DecisionService/Decide", body: flow, headers: bearer,
			code: 200, want: []string{`"workload":"web-1"`, `"candidates":[`}},
		{name: "status, the token", method: "POST", path: "/api/verdict.v1.PolicyService/Status", body: `{}`, headers: bearer, code: 200},
		{name: "documents, no token", method: "POST", path: "/api/documents", body: `{"yaml":"kind: Mesh\nname: x\n"}`, code: 401},
		{name: "documents, the token", method: "POST", path: "/api/documents", body: `{"yaml":"kind: Mesh\nname: x\n"}`,
			headers: bearer, code: 200, want: []string{`"mesh":{"kind":"Mesh","name":"x"}`}},
		{name: "lint, the token", method: "POST", path: "/api/verdict.v1.AnalysisService/Lint", body: `{}`, headers: bearer, code: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, hs.URL) })
	}
}

// Every method the page may call reads: none writes, none streams from the
// client; each is a method of the API whose answer is read as the table
// says (a unary method whole, a stream by its first message or its pages).
func TestMethodsRead(t *testing.T) {
	t.Parallel()
	for _, m := range explorer.Methods() {
		for _, w := range []string{"Apply", "Delete", "Revert", "Stream"} {
			if strings.Contains(m, w) {
				t.Errorf("the explorer calls %s", m)
			}
		}
		if !explorer.Callable(m) {
			t.Errorf("%s: not a method of the API, or its answer is not read as its kind", m)
		}
	}
}

func TestAllowedHost(t *testing.T) {
	t.Parallel()
	hosts := []string{"verdict.example.com"}
	tests := []struct {
		host string
		want bool
	}{
		{"127.0.0.1:7072", true},
		{"127.0.0.1", true},
		{"[::1]:7072", true},
		{"10.0.0.5:443", true},
		{"localhost:7072", true},
		{"LOCALHOST", true},
		{"verdict.example.com", true},
		{"Verdict.Example.Com.:443", true},
		{"rebound.example:7072", false},
		{"localhost.rebound.example", false},
		{"127.0.0.1.rebound.example", false},
		{"", false},
		{":7072", false},
	}
	for _, tc := range tests {
		if got := explorer.AllowedHost(tc.host, hosts); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.host, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []explorer.Config{{}, {Conn: nil, Hosts: []string{"a.example:80"}}, {CallTimeout: -1}} {
		if _, err := explorer.New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

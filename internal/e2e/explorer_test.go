package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/internal/testpki"
)

// The web explorer (docs/explorer.md) against a real verdictd: its views in
// a real browser, and its guards over HTTP.

const shopPolicies = `
kind: Mesh
name: shop
defaultAction: DENY
---
kind: Workload
mesh: shop
name: web-1
tags: {app: web, tier: front}
addresses: [10.1.0.1]
principal: spiffe://shop/web
---
kind: Workload
mesh: shop
name: db-1
tags: {app: db, tier: data}
addresses: [10.1.0.2]
---
kind: Policy
mesh: shop
name: web-to-db
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
---
kind: Policy
mesh: shop
name: nothing-else-to-db
sources: [{match: {app: '*'}}]
destinations: [{match: {app: db}}]
action: DENY
`

// explorerDaemon is a verdictd serving the explorer over shopPolicies.
type explorerDaemon struct {
	*daemon
	ui string // http://127.0.0.1:PORT
}

// startExplorer starts verdictd with --ui-listen on a free loopback port and
// the shop's policies, and waits until both the API serves them and the page
// answers.
func startExplorer(t testing.TB, args ...string) *explorerDaemon {
	t.Helper()
	file := filepath.Join(t.TempDir(), "shop.yaml")
	if err := os.WriteFile(file, []byte(shopPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	return startExplorerWith(t, file, args...)
}

func startExplorerWith(t testing.TB, bootstrap string, args ...string) *explorerDaemon {
	t.Helper()
	ui := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDaemon(t, append([]string{"--ui-listen", ui, "--bootstrap", bootstrap}, args...)...)
	waitServing(t, d.conn(t))
	e := &explorerDaemon{daemon: d, ui: "http://" + ui}
	waitHTTP(t, e.ui+"/")
	return e
}

// The URL renders that decision: ALLOW by web-to-db; each end form
// decides the same flow; both sides' candidate tables are shown.
func TestExplorerDecide(t *testing.T) {
	d := startExplorer(t)
	b := newBrowser(t)
	tests := []struct {
		name, query      string
		action, policy   string
		outboundDecided  string // the decided candidate's policy on the outbound side
		sourceResolution string // a part of how the source resolved
	}{
		{"workloads", "?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432", "ALLOW", "web-to-db", "web-to-db", "workload web-1"},
		{"addresses", "?mesh=shop&src=address:10.1.0.1&dst=address:10.1.0.2&proto=TCP&port=5432", "ALLOW", "web-to-db", "web-to-db", "address → workload web-1"},
		{"principal to tags", "?mesh=shop&src=principal:spiffe://shop/web&dst=tags:app=db&proto=TCP&port=5432", "ALLOW", "web-to-db", "web-to-db", "principal holders"},
		{"another port", "?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=22", "DENY", "nothing-else-to-db", "nothing-else-to-db", "workload web-1"},
		{"escaped URL", "?mesh=shop&src=workload%3Aweb-1&dst=tags%3Aapp%3Ddb%2Ctier%3Ddata&proto=TCP&port=5432", "ALLOW", "web-to-db", "web-to-db", "workload web-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.t = t
			b.open(d.ui+"/"+tc.query, "decide")
			if got := b.text("#verdict-action"); got != tc.action {
				t.Errorf("action %q, want %q", got, tc.action)
			}
			if got := b.text("#verdict-policy"); got != tc.policy {
				t.Errorf("policy %q, want %q", got, tc.policy)
			}
			sides := b.text("#sides")
			if !strings.Contains(sides, "outbound") || !strings.Contains(sides, "inbound") || !strings.Contains(sides, tc.policy) {
				t.Errorf("both sides' answers are not shown:\n%s", sides)
			}
			if got := b.text("#trace-outbound tr.decided"); !strings.Contains(got, tc.outboundDecided) || !strings.Contains(got, "MATCHED, DECIDED") {
				t.Errorf("outbound decided candidate %q, want %s", got, tc.outboundDecided)
			}
			if n := eval[int](b, `document.querySelectorAll('#trace-inbound table.candidates tbody tr').length`); n < 2 {
				t.Errorf("inbound candidate table has %d rows, want both policies", n)
			}
			if got := b.text("#ends"); !strings.Contains(got, tc.sourceResolution) {
				t.Errorf("ends %q, want %q", got, tc.sourceResolution)
			}
			// The form shows the URL's flow.
			q, err := url.ParseQuery(strings.TrimPrefix(tc.query, "?"))
			if err != nil {
				t.Fatal(err)
			}
			for _, end := range []string{"src", "dst"} {
				expr := fmt.Sprintf(`document.getElementById('%s-form').value + ':' + document.getElementById('%s-value').value`, end, end)
				if got := eval[string](b, expr); got != q.Get(end) {
					t.Errorf("the form's %s is %q, the URL's %q", end, got, q.Get(end))
				}
			}
		})
	}
	b.t = t
	b.open(d.ui+"/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432", "decide")
	b.screenshot("explorer-decide")
	t.Logf("first contentful paint %.1f ms; the answer shown in %.1f ms, the candidate tables in %.1f ms", firstPaint(b),
		eval[float64](b, `(performance.getEntriesByName('verdict:decide').pop() || {duration: 0}).duration`),
		eval[float64](b, `(performance.getEntriesByName('verdict:explain').pop() || {duration: 0}).duration`))

	// Errors of the API are shown, not thrown: an unknown workload.
	b.open(d.ui+"/?mesh=shop&src=workload:nobody&dst=workload:db-1", "decide")
	if got := b.text("#result [role=alert]"); !strings.Contains(got, "NOT_FOUND") {
		t.Errorf("unknown workload: %q, want a NOT_FOUND alert", got)
	}
	// A URL the page refuses before any call: a port without its protocol.
	b.open(d.ui+"/?mesh=shop&src=workload:web-1&dst=workload:db-1&port=5432", "decide")
	if got := b.text("#result [role=alert]"); !strings.Contains(got, "a port needs its protocol") {
		t.Errorf("port without protocol: %q", got)
	}
	b.noConsoleProblems(notFoundLoads)
}

// notFoundLoads: the browser logs a failed load for the API's 404 (an
// unknown workload), which the page shows as an alert.
func notFoundLoads(m chromedp.ConsoleMessage) bool {
	return m.Source == "network" && strings.Contains(m.Text, "404")
}

// The workload view: its facts, its rules in decision order, links to
// decide views; back and forward walk the views.
func TestExplorerWorkload(t *testing.T) {
	d := startExplorer(t)
	b := newBrowser(t)

	b.open(d.ui+"/?view=workload&mesh=shop", "workload")
	if got := b.text("#workloads"); !strings.Contains(got, "web-1") || !strings.Contains(got, "db-1") {
		t.Errorf("the mesh's workloads:\n%s", got)
	}
	b.do(chromedp.Click(chromedp.CSS(`#workloads a[href*="workload=db-1"]`)))
	b.waitFor("the workload's URL", `location.search.includes('workload=db-1')`)
	b.waitView("workload", "ready")
	if got := eval[string](b, `location.search`); !strings.Contains(got, "workload=db-1") {
		t.Errorf("the URL %q does not hold the workload", got)
	}
	for sel, want := range map[string]string{"#workload-tags": "app=db", "#workload-addresses": "10.1.0.2", "h1": "Workload db-1"} {
		if got := b.text(sel); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", sel, got, want)
		}
	}
	inbound := eval[[]string](b, `[...document.querySelectorAll('#rules-inbound tbody tr')].map(r => r.cells[1].innerText)`)
	if !slices.Equal(inbound, []string{"web-to-db", "nothing-else-to-db"}) {
		t.Errorf("inbound rules in order %q, want web-to-db then nothing-else-to-db", inbound)
	}
	b.screenshot("explorer-workload")

	// The rule's flow: web's tags to db-1 on TCP/5432, allowed by web-to-db.
	b.do(chromedp.Click(chromedp.CSS(`#rules-inbound tbody tr:first-child a[aria-label^="decide"]`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("the rule's flow: %q, want ALLOW web-to-db", got)
	}
	decideURL := eval[string](b, `location.search`)
	if !strings.Contains(decideURL, "src=tags:app=web") || !strings.Contains(decideURL, "dst=workload:db-1") || !strings.Contains(decideURL, "port=5432") {
		t.Errorf("the decide view's URL %q does not hold the flow", decideURL)
	}

	// The rule's policy: its detail in the policies view.
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView("workload", "ready")
	b.do(chromedp.Click(chromedp.CSS(`#rules-inbound tbody tr:first-child a[href*="view=policies"]`)))
	b.waitView("policies", "ready")
	if got := b.text("h1"); got != "Policy TrafficPermission/web-to-db" {
		t.Errorf("the rule's policy: %q", got)
	}
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView("workload", "ready")
	b.do(chromedp.Click(chromedp.CSS(`#rules-inbound tbody tr:first-child a[aria-label^="decide"]`)))
	b.waitView("decide", "ready")

	// Back to the workload, forward to the decision.
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView("workload", "ready")
	if got := b.text("h1"); got != "Workload db-1" {
		t.Errorf("back: %q", got)
	}
	b.do(chromedp.Evaluate[chromedp.Void](`history.forward()`))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action"); got != "ALLOW" {
		t.Errorf("forward: %q", got)
	}

	// The decision links to the workloads of its ends.
	b.do(chromedp.Click(chromedp.CSS(`#ends a[href*="workload=db-1"]`)))
	b.waitView("workload", "ready")
	// The pair links: web-1 → db-1 without a port: denied, no rule with ports matches.
	b.do(chromedp.Click(chromedp.CSS(`#peer-links a[href*="src=workload:web-1"]`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action"); got != "DENY" {
		t.Errorf("web-1 → db-1 with no port: %q, want DENY", got)
	}
	b.noConsoleProblems(nil)
}

// unlabelled lists the controls without a name, the tables without a
// caption, the links without text, and the forms and navigations (pagers)
// without a name.
const unlabelled = `(() => {
	const bad = [];
	for (const el of document.querySelectorAll('input, select, textarea, button')) {
		const named = [...(el.labels || [])].some((l) => l.textContent.trim()) || el.getAttribute('aria-label') ||
			el.getAttribute('aria-labelledby') || (el.tagName === 'BUTTON' && el.textContent.trim());
		if (!named) bad.push(el.id || el.outerHTML.slice(0, 80));
	}
	for (const tb of document.querySelectorAll('table')) if (!tb.caption || !tb.caption.textContent.trim()) bad.push('a table without caption');
	for (const a of document.querySelectorAll('a')) if (!a.textContent.trim() && !a.getAttribute('aria-label')) bad.push('a link without text');
	for (const f of document.querySelectorAll('form')) if (!f.getAttribute('aria-label') && !f.getAttribute('aria-labelledby')) bad.push('a form without name');
	for (const n of document.querySelectorAll('nav')) if (!n.getAttribute('aria-label')) bad.push('a navigation without name');
	return bad;
})()`

// Every control is labelled, every table has a caption; Tab reaches the
// form's fields in order and its submit, and Enter on it decides.
func TestExplorerAccessibility(t *testing.T) {
	d := startExplorer(t)
	b := newBrowser(t)
	for _, page := range []struct{ query, view string }{
		{"/", "decide"},
		{"/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432", "decide"},
		{"/?view=workload&mesh=shop", "workload"},
		{"/?view=workload&mesh=shop&workload=db-1", "workload"},
		{"/?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432", "reach"},
		{"/?view=reach", "reach"},
		{"/?view=policies&mesh=shop", "policies"},
		{"/?view=policies&mesh=shop&policy=TrafficPermission/web-to-db", "policies"},
		{"/?view=impact", "impact"},
		{"/?view=impact&delete=shop/policies/TrafficPermission/web-to-db", "impact"},
		{"/?view=history&key=shop/policies/TrafficPermission/web-to-db", "history"},
		{"/?view=history", "history"},
	} {
		b.open(d.ui+page.query, page.view)
		if bad := eval[[]string](b, unlabelled); len(bad) > 0 {
			t.Errorf("%s: without a name: %q", page.query, bad)
		}
	}

	// Keyboard only, from the top of the empty form.
	b.open(d.ui+"/", "decide")
	var order []string
	for range 30 {
		b.do(chromedp.KeyEvent("\t"))
		id := eval[string](b, `document.activeElement.id || document.activeElement.tagName + ':' + document.activeElement.textContent.trim()`)
		order = append(order, id)
		if id == "decide-submit" {
			break
		}
	}
	want := []string{"mesh", "type", "src-form", "src-value", "dst-form", "dst-value", "proto", "port", "decide-submit"}
	var got []string
	for _, id := range order {
		if slices.Contains(want, id) {
			got = append(got, id)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Tab reaches %q (all: %q), want the form's fields in order, then its submit", got, order)
	}
	if !strings.HasPrefix(order[0], "A:") {
		t.Errorf("the first Tab stop is %q, want the skip link", order[0])
	}
	// Fill the form by keyboard: focus each field with Tab from the mesh.
	b.do(chromedp.Click(chromedp.ID("mesh")), chromedp.KeyEvent("shop"),
		chromedp.KeyEvent("\t"), chromedp.KeyEvent("\t"), // type, then the source's form: Workload
		chromedp.KeyEvent("\t"), chromedp.KeyEvent("web-1"),
		chromedp.KeyEvent("\t"), chromedp.KeyEvent("\t"), chromedp.KeyEvent("db-1"),
		chromedp.SetValue(chromedp.ID("proto"), "TCP"), chromedp.Click(chromedp.ID("port")), chromedp.KeyEvent("5432"),
		chromedp.KeyEvent("\t"))
	if id := eval[string](b, `document.activeElement.id`); id != "decide-submit" {
		t.Fatalf("after the port, Tab focuses %q, want the submit", id)
	}
	b.do(chromedp.KeyEvent("\r"))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("decided by keyboard: %q", got)
	}
	if got := eval[string](b, `location.search`); got != "?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432" {
		t.Errorf("the URL after the form: %q", got)
	}
	if id := eval[string](b, `document.activeElement.id`); id != "result-title" {
		t.Errorf("after deciding, focus is on %q, want the result's heading", id)
	}
	b.noConsoleProblems(nil)
}

// With a token configured, the page asks for it and nothing is readable
// without it.
func TestExplorerToken(t *testing.T) {
	token := "explorer-secret"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startExplorer(t, "--auth-token-file", file)
	b := newBrowser(t)
	flow := d.ui + "/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432"
	b.do(chromedp.Navigate(flow))
	b.waitView("decide", "token")
	if got := b.text("main"); strings.Contains(got, "web-to-db") || !strings.Contains(got, "needs a token") {
		t.Errorf("without the token the page shows:\n%s", got)
	}
	if id := eval[string](b, `document.activeElement.id`); id != "token" {
		t.Errorf("the token field is not focused: %q", id)
	}
	b.screenshot("explorer-token")

	// A wrong token: asked again, with the server's refusal.
	b.do(chromedp.SendKeys(chromedp.ID("token"), "nope"), chromedp.Click(chromedp.ID("token-submit")))
	b.waitFor("the refusal", `!!document.querySelector('main [role=alert]')`)
	b.waitView("decide", "token")
	if got := b.text("main [role=alert]"); !strings.Contains(got, "UNAUTHENTICATED") {
		t.Errorf("a wrong token: alert %q", got)
	}
	// The token: the view the URL names.
	b.do(chromedp.SendKeys(chromedp.ID("token"), token), chromedp.KeyEvent("\r"))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("with the token: %q", got)
	}
	// Kept for the tab: a reload and another view need not ask again.
	b.open(d.ui+"/?view=workload&mesh=shop&workload=web-1", "workload")
	if got := b.text("#workload-tags"); !strings.Contains(got, "app=web") {
		t.Errorf("workload with the token: %q", got)
	}
	// Forgotten: asked again.
	b.do(chromedp.Click(chromedp.ID("forget-token")))
	b.waitView("workload", "token")
	if got := eval[string](b, `sessionStorage.getItem('verdict.token') || ''`); got != "" {
		t.Errorf("the token is still stored: %q", got)
	}
	b.noConsoleProblems(refusedLoads)
}

// refusedLoads: the browser logs a failed load for each 401 the page gets
// before it asks for the token.
func refusedLoads(m chromedp.ConsoleMessage) bool {
	return m.Source == "network" && strings.Contains(m.Text, "401")
}

// The guards, over plain HTTP: a cross-origin request and a wrong Host are
// refused, and with a token configured the API answers 401 without it.
func TestExplorerGuards(t *testing.T) {
	token := "explorer-secret"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := startExplorer(t, "--auth-token-file", file)
	dev := startExplorer(t)
	decide := `{"mesh":"shop","source":{"workload":"web-1"},"destination":{"workload":"db-1"},"protocol":"TCP","port":5432}`
	tests := []struct {
		name    string
		d       *explorerDaemon
		method  string
		path    string
		body    string
		headers map[string]string
		host    string // "" : the listener's address
		code    int
		want    string // a part of the body
	}{
		{"the page", withToken, "GET", "/", "", nil, "", 200, "<title>verdict explorer</title>"},
		{"the page by localhost", withToken, "GET", "/", "", nil, "localhost", 200, ""},
		{"another host", withToken, "GET", "/", "", nil, "rebound.example", 421, "unknown host"},
		{"another host, API", dev, "POST", "/api/verdict.v1.DecisionService/Decide", decide, nil, "rebound.example:80", 421, ""},
		{"no token", withToken, "POST", "/api/verdict.v1.DecisionService/Decide", decide, nil, "", 401, "needs the bearer token"},
		{"a wrong token", withToken, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Authorization": "Bearer nope"}, "", 401, ""},
		{"the token", withToken, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Authorization": "Bearer " + token}, "", 200, `"policy":"web-to-db"`},
		{"the token, Status", withToken, "POST", "/api/verdict.v1.PolicyService/Status", "{}",
			map[string]string{"Authorization": "Bearer " + token}, "", 200, `"synced":true`},
		{"cross-origin", withToken, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Authorization": "Bearer " + token, "Origin": "http://evil.example"}, "", 403, "cross-origin"},
		{"cross-site fetch", dev, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Sec-Fetch-Site": "cross-site"}, "", 403, "cross-origin"},
		{"same origin", dev, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Origin": dev.ui, "Sec-Fetch-Site": "same-origin"}, "", 200, `"action":"ACTION_ALLOW"`},
		{"development mode, no token", dev, "POST", "/api/verdict.v1.DecisionService/Decide", decide, nil, "", 200, `"workload":"web-1"`},
		{"a write", dev, "POST", "/api/verdict.v1.PolicyService/Delete", `{"keys":["shop/policies/TrafficPermission/web-to-db"]}`, nil, "", 404,
			"not a method the explorer calls"},
		{"not JSON", dev, "POST", "/api/verdict.v1.DecisionService/Decide", decide,
			map[string]string{"Content-Type": "text/plain"}, "", 400, "application/json"},
		{"the method table's validation", dev, "POST", "/api/verdict.v1.DecisionService/Decide",
			`{"source":{"tags":{"a":"b"}},"destination":{"workload":"x","address":"10.0.0.1"}}`, nil, "", 400, "fieldViolations"},
		{"GET of the API", dev, "GET", "/api/verdict.v1.DecisionService/Decide", "", nil, "", 405, ""},
		{"no directory listing", dev, "GET", "/views/", "", nil, "", 404, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.d.ui+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.method == "POST" {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
				t.Errorf("%d %s, want %d with %q", resp.StatusCode, body, tc.code, tc.want)
			}
			if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
		})
	}
}

// With TLS, the explorer serves HTTPS with the gRPC listener's certificate
// and asks browsers for no client certificate, even where the gRPC listener
// requires one: its callers give the token.
func TestExplorerTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "verdict explorer CA")
	caFile := ca.Write(t, dir, "ca")
	srvCert, srvKey := ca.Server(t).Write(t, dir, "server")
	opsCert, opsKey := ca.Client(t, nil, "spiffe://verdict.test/ops").Write(t, dir, "ops")
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("tls-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	policies := filepath.Join(dir, "shop.yaml")
	if err := os.WriteFile(policies, []byte(shopPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	ui := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDaemon(t, "--bootstrap", policies, "--ui-listen", ui, "--tls-cert", srvCert, "--tls-key", srvKey,
		"--tls-client-ca", caFile, "--tls-require-client-cert", "--allow-identity", "spiffe://verdict.test/ops",
		"--auth-token-file", token)
	waitServing(t, d.conn(t, grpc.WithTransportCredentials((&tlsFiles{ca: caFile, cert: opsCert, key: opsKey}).creds(t))))
	client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	waitHTTPWith(t, client, "https://"+ui+"/")
	req, err := http.NewRequest("POST", "https://"+ui+"/api/verdict.v1.DecisionService/Decide",
		strings.NewReader(`{"mesh":"shop","source":{"workload":"web-1"},"destination":{"workload":"db-1"},"protocol":"TCP","port":5432}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tls-secret")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("HTTPS without a client certificate: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"policy":"web-to-db"`) {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("HTTPS is served as %s, want HTTP/2", resp.Proto)
	}
	if resp, err := http.Get("http://" + ui + "/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("plain HTTP to the HTTPS explorer: %s", resp.Status)
		}
	}
}

// The explorer's address follows --listen's rules: beyond loopback it needs
// authorization, and then TLS.
func TestExplorerRefusedBeyondLoopback(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ui-listen", "0.0.0.0:0"}, "--ui-listen 0.0.0.0:0 is beyond loopback: configure authorization"},
		{[]string{"--ui-listen", "0.0.0.0:0", "--auth-token-file", token}, "--ui-listen 0.0.0.0:0 is beyond loopback without TLS"},
	} {
		r := runTool(t, nil, nil, "verdictd", append(tc.args, "--data-dir", t.TempDir())...)
		if r.code != 2 || !strings.Contains(r.out, tc.want) {
			t.Errorf("%v: exit %d\n%s", tc.args, r.code, r.out)
		}
	}
}

package e2e

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The explorer's views of the analysis, lint and history services
// (docs/explorer.md): reach, policies with their lint findings, impact
// preview and history, each against a real verdictd in a real browser.

// viewsPolicies are the shop's, with a policy that web-to-db shadows (a lint
// error) and one that lets an office's addresses reach the database (a
// class outside the inventory).
const viewsPolicies = shopPolicies + `
---
kind: Policy
mesh: shop
name: web-to-db-again
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
---
kind: Policy
mesh: shop
name: office-to-db
sources: [{expressions: [{key: ip, operator: CIDR, values: [192.168.0.0/16]}]}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
`

// startViews starts verdictd with --ui-listen over viewsPolicies and more.
func startViews(t testing.TB, more string, args ...string) *explorerDaemon {
	t.Helper()
	file := filepath.Join(t.TempDir(), "shop.yaml")
	if err := os.WriteFile(file, []byte(viewsPolicies+more), 0o600); err != nil {
		t.Fatal(err)
	}
	return startExplorerWith(t, file, args...)
}

// apply writes documents with verdictctl and returns the revision it wrote,
// as apply prints it: the snapshot's revision may be past it already (the
// daemon's own records move the store's revision too).
func (d *explorerDaemon) apply(t testing.TB, docs string) int64 {
	t.Helper()
	file := filepath.Join(t.TempDir(), "change.yaml")
	if err := os.WriteFile(file, []byte(docs), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runTool(t, nil, nil, "verdictctl", "apply", "--server", d.addr, "--lint=off", "-f", file)
	if r.code != 0 {
		t.Fatalf("verdictctl apply: exit %d\n%s", r.code, r.out)
	}
	m := regexp.MustCompile(`(?m)^revision (\d+)$`).FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("verdictctl apply names no revision:\n%s", r.out)
	}
	rev, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// waitLog waits until verdictd's log holds text.
func (d *explorerDaemon) waitLog(t testing.TB, text string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.log.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("verdictd did not log %q:\n%s", text, d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rows are the texts of a table's body cells, row by row.
func (b *browser) rows(css string) [][]string {
	b.t.Helper()
	return eval[[][]string](b, fmt.Sprintf(`[...document.querySelectorAll(%q)].map((r) => [...r.cells].map((c) => c.innerText.trim()))`,
		css+" tbody tr"))
}

// rowWith is the first row of a table holding every one of want, or nil.
func rowWith(rows [][]string, want ...string) []string {
	for _, r := range rows {
		line := strings.Join(r, " | ")
		if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(line, w) }) {
			return r
		}
	}
	return nil
}

// changes are the rows of the impact view's changed flows (not their groups'
// headings).
func (b *browser) changes() [][]string {
	b.t.Helper()
	return eval[[][]string](b, `[...document.querySelectorAll('#impact-changes tr.change')].map((r) => [...r.cells].map((c) => c.innerText.trim()))`)
}

// badRequests: the browser logs a failed load for the API's 400, 404 (a
// document that does not decode, a page past the last), which the page
// shows as an alert.
func badRequests(m chromedp.ConsoleMessage) bool {
	return m.Source == "network" && (strings.Contains(m.Text, "400") || strings.Contains(m.Text, "404"))
}

// Reach from the workload page: who can reach db-1 on TCP 5432, by name,
// grouped by policy and outside the inventory, in pages, each entry linking
// to its flow's decide view.
func TestExplorerReach(t *testing.T) {
	// 1,100 replicas of web: the answer of who can reach db-1 takes two pages.
	var replicas strings.Builder
	for i := range 1100 {
		fmt.Fprintf(&replicas, "---\nkind: Workload\nmesh: shop\nname: web-r%04d\ntags: {app: web, tier: front}\naddresses: [10.2.%d.%d]\n",
			i, i/250, i%250+1)
	}
	d := startViews(t, replicas.String())
	b := newBrowser(t)

	b.open(d.ui+"/?view=workload&mesh=shop&workload=db-1", "workload")
	b.do(chromedp.Click(chromedp.CSS(`#reach-links a[href*="port=5432"]`)))
	b.waitView("reach", "ready")
	if got := eval[string](b, `location.search`); got != "?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432" {
		t.Errorf("the reach view's URL: %q", got)
	}
	if got := b.text("#reach-resolved"); !strings.Contains(got, "workload → workload") || !strings.Contains(got, "app=db") {
		t.Errorf("how db-1 resolved: %q", got)
	}
	if got := b.text("#reach-to-count"); got != "1000 workloads, 0 classes outside the inventory on page 1 of 2" {
		t.Errorf("who can reach db-1, page 1: %q", got)
	}
	to := b.rows("#reach-to table.reach-workloads")
	if r := rowWith(to, "web-1", "web-to-db"); r == nil || r[2] != "web-to-db" || r[3] != "web-to-db" {
		t.Errorf("web-1 reaches db-1 by web-to-db on both sides: %q", r)
	}
	if groups := b.rows("#reach-to table.reach-groups"); len(groups) != 1 || groups[0][2] != "1000" {
		t.Errorf("the page's workloads grouped by policy: %q", groups)
	}
	if got := b.text("#reach-from"); !strings.Contains(got, "No peer is allowed") {
		t.Errorf("what db-1 can reach: %q", got)
	}

	// The second page: the last 101 web workloads and the office's addresses.
	b.do(chromedp.Click(chromedp.CSS(`#reach-to nav.pager a[rel=next]`)))
	b.waitFor("the second page", `location.search.includes('topage=2')`)
	b.waitView("reach", "ready")
	if got := b.text("#reach-to-count"); got != "101 workloads, 1 class outside the inventory on page 2 of 2" {
		t.Errorf("who can reach db-1, page 2: %q", got)
	}
	b.screenshot("explorer-reach")
	outside := b.rows("#reach-to table.reach-outside")
	if len(outside) != 1 || outside[0][0] != "addresses 192.168.0.0/16" || outside[0][1] != "office-to-db" {
		t.Fatalf("outside the inventory: %q", outside)
	}
	// The class's flow: an address of the block to db-1, allowed by office-to-db.
	b.do(chromedp.Click(chromedp.CSS(`#reach-to table.reach-outside a`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW office-to-db" {
		t.Errorf("the office's flow: %q", got)
	}
	if got := eval[string](b, `location.search`); got != "?mesh=shop&src=address:192.168.0.0&dst=workload:db-1&proto=TCP&port=5432" {
		t.Errorf("the office's flow's URL: %q", got)
	}
	// Back on the page, a workload's flow.
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView("reach", "ready")
	b.do(chromedp.Click(chromedp.CSS(`#reach-to table.reach-workloads tbody tr:first-child a[aria-label^="decide"]`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("a replica's flow: %q", got)
	}
	if got := eval[string](b, `location.search`); !strings.HasPrefix(got, "?mesh=shop&src=workload:web-r") {
		t.Errorf("a replica's flow's URL: %q", got)
	}

	// By keyboard: Tab walks the form's fields in order to its submit, and
	// Enter on it shows the reach of what was typed.
	b.open(d.ui+"/?view=reach", "reach")
	b.do(chromedp.Click(chromedp.ID("reach-mesh")), chromedp.KeyEvent("shop"))
	var order []string
	for range 6 {
		b.do(chromedp.KeyEvent("\t"))
		order = append(order, eval[string](b, `document.activeElement.id`))
	}
	if want := []string{"reach-type", "reach-form", "reach-value", "reach-proto", "reach-port", "reach-submit"}; !slices.Equal(order, want) {
		t.Errorf("Tab from the mesh reaches %q, want %q", order, want)
	}
	b.do(chromedp.Focus(chromedp.ID("reach-value")), chromedp.KeyEvent("db-1"),
		chromedp.SetValue(chromedp.ID("reach-proto"), "TCP"), chromedp.Focus(chromedp.ID("reach-port")), chromedp.KeyEvent("5432\t"))
	if id := eval[string](b, `document.activeElement.id`); id != "reach-submit" {
		t.Fatalf("Tab from the port focuses %q", id)
	}
	b.do(chromedp.KeyEvent("\r"))
	b.waitFor("the typed endpoint's URL", `location.search === '?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432'`)
	b.waitView("reach", "ready")
	if got := b.text("#reach-to-count"); !strings.HasPrefix(got, "1000 workloads") {
		t.Errorf("who can reach db-1 on TCP 5432, typed: %q", got)
	}

	// What web-1 can reach: db-1, and an address given outside the inventory.
	b.open(d.ui+"/?view=reach&mesh=shop&end=address:10.1.0.1&proto=TCP&port=5432", "reach")
	if from := b.rows("#reach-from table.reach-workloads"); rowWith(from, "db-1", "web-to-db") == nil || len(from) != 1 {
		t.Errorf("what web-1's address can reach: %q", from)
	}
	// A page past the last is said, not thrown.
	b.open(d.ui+"/?view=reach&mesh=shop&end=workload:web-1&proto=TCP&port=5432&frompage=3", "reach")
	if got := b.text("#reach-from [role=alert]"); !strings.Contains(got, "NOT_FOUND") {
		t.Errorf("a page past the last: %q", got)
	}
	b.noConsoleProblems(badRequests)
}

// The policies view: the mesh's policies with their lint findings, the
// witness's flow, a policy's detail with its document, findings and versions.
func TestExplorerPolicies(t *testing.T) {
	d := startViews(t, "")
	b := newBrowser(t)

	b.open(d.ui+"/?view=policies&mesh=shop", "policies")
	policies := b.rows("#policies")
	var names []string
	for _, r := range policies {
		names = append(names, r[0])
	}
	want := []string{"TrafficPermission/nothing-else-to-db", "TrafficPermission/office-to-db", "TrafficPermission/web-to-db",
		"TrafficPermission/web-to-db-again"}
	if !slices.Equal(names, want) {
		t.Errorf("the policies %q, want %q", names, want)
	}
	if r := rowWith(policies, "web-to-db-again"); r == nil || !strings.Contains(r[7], "1 error") || !strings.Contains(r[8], "Shadowed") {
		t.Errorf("web-to-db-again's lint and conditions columns: %q", r)
	}
	if r := rowWith(policies, "TrafficPermission/web-to-db"); r == nil || !strings.Contains(r[8], "Enforced") || strings.Contains(r[8], "Shadowed") {
		t.Errorf("web-to-db's conditions column: %q", r)
	}
	findings := b.rows("#findings")
	shadowed := rowWith(findings, "shadowed", "web-to-db-again")
	if shadowed == nil || shadowed[0] != "error" || !strings.Contains(shadowed[5], "{app=web} → {app=db} TCP 5432") ||
		!strings.Contains(shadowed[6], "web-to-db sources[0]/destinations[0] ALLOW") {
		t.Errorf("the shadowed finding: %q\nall: %q", shadowed, findings)
	}
	if got := b.text("#lint-summary"); !strings.Contains(got, "1 errors") {
		t.Errorf("the lint summary: %q", got)
	}
	b.screenshot("explorer-policies")

	// The witness's flow: what decides it is the covering rule.
	b.do(chromedp.Click(chromedp.CSS(`#findings tr.sev-error a.witness`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("the witness: %q", got)
	}
	if got := eval[string](b, `location.search`); got != "?mesh=shop&type=TrafficPermission&src=tags:app=web&dst=tags:app=db&proto=TCP&port=5432" {
		t.Errorf("the witness's URL: %q", got)
	}

	// A policy's detail.
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView("policies", "ready")
	// By keyboard: the mesh, the type, the submit; Enter lists the type.
	b.do(chromedp.Focus(chromedp.ID("pol-mesh")), chromedp.KeyEvent("\t"))
	if id := eval[string](b, `document.activeElement.id`); id != "pol-type" {
		t.Errorf("Tab from the mesh focuses %q", id)
	}
	b.do(chromedp.KeyEvent("TrafficPermission"), chromedp.KeyEvent("\t"))
	if id := eval[string](b, `document.activeElement.id`); id != "policies-submit" {
		t.Errorf("Tab from the type focuses %q", id)
	}
	b.do(chromedp.KeyEvent("\r"))
	b.waitFor("the type's URL", `location.search.includes('type=TrafficPermission')`)
	b.waitView("policies", "ready")
	if n := len(b.rows("#policies")); n != 4 {
		t.Errorf("the type's policies: %d, want 4", n)
	}
	b.do(chromedp.Click(chromedp.CSS(`#policies a[href*="policy=TrafficPermission/web-to-db-again"]`)))
	b.waitView("policies", "ready")
	if got := b.text("#policy-document"); !strings.Contains(got, "name: web-to-db-again") || !strings.Contains(got, `ports: "5432"`) {
		t.Errorf("the document:\n%s", got)
	}
	if got := b.rows("#findings"); len(got) != 1 || got[0][1] != "shadowed" {
		t.Errorf("its findings: %q", got)
	}
	if n := eval[int](b, `document.querySelectorAll('#versions li.version').length`); n != 1 {
		t.Errorf("its versions: %d, want 1", n)
	}
	if got := b.text("#versions li.version h3"); !strings.Contains(got, "created") {
		t.Errorf("its version: %q", got)
	}
	b.noConsoleProblems(nil)
}

// The impact view: pasted YAML → the flows it changes, before → after,
// grouped; nothing is written.
func TestExplorerImpact(t *testing.T) {
	// Without retention the daemon writes nothing of its own (no election,
	// no revision-time samples) once it has registered in the fleet: the
	// store's revision moves only if the explorer writes.
	d := startViews(t, "", "--retention", "off")
	d.waitLog(t, "fleet: registered")
	b := newBrowser(t)
	pol := verdictv1.NewPolicyServiceClient(d.conn(t))
	before, err := pol.Status(ctxT(t), &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	freeze := "kind: Policy\nmesh: shop\nname: freeze-db\npriority: -1\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: db}}]\naction: DENY\n"
	b.open(d.ui+"/?view=impact&mesh=shop", "impact")
	b.do(chromedp.SetValue(chromedp.ID("impact-doc"), freeze), chromedp.Click(chromedp.ID("impact-submit")))
	b.waitFor("the preview's URL", `location.search.includes('doc=')`)
	b.waitView("impact", "ready")
	q, err := url.ParseQuery(strings.TrimPrefix(eval[string](b, `location.search`), "?"))
	if err != nil || q.Get("doc") != freeze {
		t.Errorf("the URL holds the documents: %q %v", q.Get("doc"), err)
	}
	changes := b.changes()
	if got := b.text("#impact-title"); len(changes) < 2 || got != fmt.Sprintf("%d flows would change", len(changes)) {
		t.Errorf("the preview: %q, with %d changed flows listed", got, len(changes))
	}
	if got := b.text("#impact-meta"); !strings.Contains(got, "nothing was written") {
		t.Errorf("the preview's meta: %q", got)
	}
	if g := rowWith(b.rows("#impact-groups"), "freeze-db", "db-1", "TCP 5432"); g == nil || g[3] != "1" {
		t.Errorf("the groups: %q", b.rows("#impact-groups"))
	}
	changed := rowWith(changes, "web-1", "db-1", "TCP 5432")
	if changed == nil || changed[3] != "ALLOW by web-to-db" || changed[5] != "DENY by freeze-db" {
		t.Errorf("web-1 → db-1 on TCP 5432: %q", changed)
	}
	if n := eval[int](b, `document.querySelectorAll('#impact-changes tr.action-changed').length`); n != 1 {
		t.Errorf("%d flows change their action, want 1", n)
	}
	b.screenshot("explorer-impact")

	// Nothing was written: the store's revision has not moved, and the flow
	// is decided as before.
	after, err := pol.Status(ctxT(t), &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetStoreRevision() != before.GetStoreRevision() || after.GetDigest() != before.GetDigest() {
		t.Errorf("the store moved: revision %d → %d", before.GetStoreRevision(), after.GetStoreRevision())
	}
	if _, err := pol.Get(ctxT(t), &verdictv1.GetRequest{Key: "shop/policies/TrafficPermission/freeze-db"}); status.Code(err) != codes.NotFound {
		t.Errorf("freeze-db was written: %v", err)
	}
	b.do(chromedp.Click(chromedp.CSS(`#impact-changes tr.action-changed a`)))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("the flow now: %q", got)
	}

	// By keyboard: from the documents, Tab reaches the keys to delete, the
	// fleet box and the submit, and Enter on it previews.
	b.open(d.ui+"/?view=impact", "impact")
	b.do(chromedp.Focus(chromedp.ID("impact-doc")), chromedp.KeyEvent("kind: Policy\rmesh: shop\rname: freeze-db\r"+
		"sources: [{match: {app: web}}]\rdestinations: [{match: {app: db}}]\raction: DENY\r"))
	var order []string
	for range 3 {
		b.do(chromedp.KeyEvent("\t"))
		order = append(order, eval[string](b, `document.activeElement.id`))
	}
	if !slices.Equal(order, []string{"impact-delete", "impact-fleet", "impact-submit"}) {
		t.Errorf("Tab from the documents reaches %q", order)
	}
	b.do(chromedp.KeyEvent("\r"))
	b.waitFor("the preview's URL", `location.search.includes('doc=')`)
	b.waitView("impact", "ready")
	if id := eval[string](b, `document.activeElement.id`); id != "impact-title" {
		t.Errorf("after the preview, focus is on %q, want its heading", id)
	}
	if changed := rowWith(b.changes(), "web-1", "db-1", "TCP 5432"); changed == nil || changed[5] != "DENY by freeze-db" {
		t.Errorf("typed: %q", changed)
	}

	// A delete: web-to-db-again decides in web-to-db's place, alike.
	b.open(d.ui+"/?view=impact&delete=shop/policies/TrafficPermission/web-to-db", "impact")
	changed = rowWith(b.changes(), "web-1", "db-1", "TCP 5432")
	if changed == nil || changed[3] != "ALLOW by web-to-db" || changed[5] != "ALLOW by web-to-db-again" {
		t.Errorf("without web-to-db: %q", changed)
	}

	// A document that does not decode: each field, by document and line.
	b.open(d.ui+"/?view=impact&doc="+url.QueryEscape("kind: Policy\nmesh: shop\nname: x\nsources: [{mtch: {app: web}}]\ndestinations: [{}]\n"), "impact")
	if got := b.text("#impact-result [role=alert]"); !strings.Contains(got, "documents[0] (line 1).sources[0].mtch") ||
		!strings.Contains(got, "did you mean match") {
		t.Errorf("a typo: %q", got)
	}
	if got := eval[string](b, `document.getElementById('impact-doc').value`); !strings.Contains(got, "mtch") {
		t.Errorf("the form lost the documents: %q", got)
	}
	final, err := pol.Status(ctxT(t), &verdictv1.StatusRequest{})
	if err != nil || final.GetStoreRevision() != before.GetStoreRevision() {
		t.Errorf("the store moved: %v %v", final, err)
	}
	b.noConsoleProblems(badRequests)
}

// History: a key's versions with their diffs, writer and time; the revision
// bar sets rev= on the decide and policies views.
func TestExplorerHistory(t *testing.T) {
	// The revision bar ends at the store's current revision, which the
	// daemon's own writes move too (a revision-time sample some seconds
	// after the start): without retention, and once registered in the
	// fleet, only this test writes.
	d := startViews(t, "", "--retention", "off")
	d.waitLog(t, "fleet: registered")
	b := newBrowser(t)
	st, err := verdictv1.NewPolicyServiceClient(d.conn(t)).Status(ctxT(t), &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first := st.GetRevision()
	changed := d.apply(t, "kind: Policy\nmesh: shop\nname: web-to-db\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: db}}]\n"+
		"ports: [{protocol: TCP, ports: \"5432\"}]\naction: DENY\n")
	flow := "/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432"

	b.open(d.ui+"/?view=history&key=shop/policies/TrafficPermission/web-to-db", "history")
	versions := eval[[]string](b, `[...document.querySelectorAll('#versions li.version')].map((v) => v.dataset.revision)`)
	if len(versions) != 2 || versions[1] != strconv.FormatInt(changed, 10) {
		t.Fatalf("versions at %q, want two, the second at %d", versions, changed)
	}
	second := `#versions li.version:nth-child(2)`
	if got := b.text(second + " .writer"); !strings.HasPrefix(got, "anonymous 127.0.0.1:") || !strings.Contains(got, "(apply)") {
		t.Errorf("the writer: %q", got)
	}
	if got := b.text(second + " time"); !strings.HasPrefix(got, "20") {
		t.Errorf("the time: %q", got)
	}
	added := eval[[]string](b, fmt.Sprintf(`[...document.querySelectorAll('%s pre.diff .add')].map((l) => l.innerText.trim())`, second))
	if !slices.Contains(added, "+ action: DENY") {
		t.Errorf("the diff adds %q, want the action", added)
	}
	if got := b.text(`#versions li.version:nth-child(1) pre.diff`); !strings.Contains(got, "+ name: web-to-db") {
		t.Errorf("the creation's diff:\n%s", got)
	}
	b.screenshot("explorer-history")

	// The policies just before the change: web-to-db allowed.
	b.do(chromedp.Click(chromedp.CSS(second + ` a[href*="rev=` + strconv.FormatInt(changed-1, 10) + `"]`)))
	b.waitView("policies", "ready")
	if got := policyAction(b, "TrafficPermission/web-to-db"); got != "ALLOW" {
		t.Errorf("web-to-db just before revision %d: %q", changed, got)
	}
	if got := b.text("#policies-revision"); !strings.Contains(got, "the store as it was") {
		t.Errorf("the list's revision: %q", got)
	}
	// Now: denied.
	b.do(chromedp.Click(chromedp.ID("rev-now")))
	b.waitFor("the URL without rev", `!location.search.includes('rev=')`)
	b.waitView("policies", "ready")
	if got := policyAction(b, "TrafficPermission/web-to-db"); got != "DENY" {
		t.Errorf("web-to-db now: %q", got)
	}

	// The decide view now, then at the first revision by the bar, by keyboard.
	b.open(d.ui+flow, "decide")
	if got := b.text("#verdict-action"); got != "DENY" {
		t.Errorf("now: %q", got)
	}
	b.waitFor("the revision bar's bounds", `document.getElementById('revision').dataset.ready === 'true'`)
	if got := eval[string](b, `document.getElementById('rev-slider').max`); got != strconv.FormatInt(changed, 10) {
		t.Errorf("the slider ends at %s, want the current revision %d", got, changed)
	}
	b.do(chromedp.Focus(chromedp.ID("rev-slider")), chromedp.KeyEvent(kb.ArrowLeft))
	if got := eval[string](b, `document.getElementById('rev-input').value`); got != strconv.FormatInt(changed-1, 10) {
		t.Errorf("ArrowLeft on the slider: the revision input holds %q, want %d", got, changed-1)
	}
	b.do(chromedp.Focus(chromedp.ID("rev-input")), chromedp.Evaluate[chromedp.Void](`document.getElementById('rev-input').select()`),
		chromedp.KeyEvent(strconv.FormatInt(first, 10)), chromedp.KeyEvent("\r"))
	b.waitFor("the URL with rev", fmt.Sprintf(`location.search.endsWith('&rev=%d')`, first))
	b.waitView("decide", "ready")
	if got := b.text("#verdict-action") + " " + b.text("#verdict-policy"); got != "ALLOW web-to-db" {
		t.Errorf("at revision %d: %q", first, got)
	}
	if got := b.text("#result .meta"); !strings.Contains(got, "revision "+strconv.FormatInt(first, 10)) || !strings.Contains(got, "as it was") {
		t.Errorf("the answer's revision: %q", got)
	}
	// The flow form keeps the revision.
	b.do(chromedp.Click(chromedp.ID("decide-submit")))
	b.waitView("decide", "ready")
	if got := eval[string](b, `location.search`); !strings.HasSuffix(got, fmt.Sprintf("&rev=%d", first)) {
		t.Errorf("after the form: %q", got)
	}

	// Every change of the mesh.
	b.open(d.ui+"/?view=history&key=shop/&prefix=1", "history")
	if n := eval[int](b, `document.querySelectorAll('#versions li.version').length`); n != 8 {
		t.Errorf("the mesh's versions: %d, want 8 (seven created, one updated)", n)
	}
	b.noConsoleProblems(nil)
}

// policyAction is the action column of a policy's row in the policies view.
func policyAction(b *browser, name string) string {
	b.t.Helper()
	for _, r := range b.rows("#policies") {
		if r[0] == name {
			return r[4]
		}
	}
	return ""
}

// With a token, the views' calls carry it (AnalysisService and History need
// an authorized caller), and nothing shows before it is given.
func TestExplorerViewsToken(t *testing.T) {
	token := "views-secret"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startViews(t, "", "--auth-token-file", file)
	b := newBrowser(t)
	b.do(chromedp.Navigate(d.ui + "/?view=policies&mesh=shop"))
	b.waitView("policies", "token")
	if got := b.text("main"); strings.Contains(got, "web-to-db") {
		t.Errorf("without the token the page shows:\n%s", got)
	}
	b.do(chromedp.SendKeys(chromedp.ID("token"), token), chromedp.KeyEvent("\r"))
	b.waitView("policies", "ready")
	if got := b.rows("#findings"); rowWith(got, "shadowed", "web-to-db-again") == nil {
		t.Errorf("lint with the token: %q", got)
	}
	// The revision web-to-db was written at (the daemon's own records move
	// the store's revision too).
	written := ""
	if r := rowWith(b.rows("#policies"), "TrafficPermission/web-to-db", "revision "); r != nil {
		written = strings.TrimPrefix(r[6], "revision ")
	}
	if _, err := strconv.Atoi(written); err != nil {
		t.Fatalf("web-to-db's revision: %q", written)
	}
	for _, page := range []struct{ query, view, css, want string }{
		{"/?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432", "reach", "#reach-to", "web-1"},
		{"/?view=history&key=shop/policies/TrafficPermission/web-to-db", "history", "#versions", "created"},
		{"/?view=impact&delete=shop/policies/TrafficPermission/web-to-db", "impact", "#impact-changes", "web-to-db-again"},
		{"/?view=policies&mesh=shop&policy=TrafficPermission/web-to-db", "policies", "#policy-document", "name: web-to-db"},
		// at_revision reads need an authorized caller too.
		{"/?view=policies&mesh=shop&rev=" + written, "policies", "#policies-revision", "the store as it was"},
		{"/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432&rev=" + written, "decide", "#result", "web-to-db"},
	} {
		b.open(d.ui+page.query, page.view)
		if got := b.text(page.css); !strings.Contains(got, page.want) {
			t.Errorf("%s: %s lacks %q:\n%s", page.query, page.css, page.want, got)
		}
	}

	// A token the server refuses: each view says so, asks again, and shows
	// nothing of the store (an unauthorized History, Lint, Reach, Impact).
	b.do(chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem('verdict.token', 'not-the-token')`))
	for _, page := range []struct{ query, view string }{
		{"/?view=history&key=shop/policies/TrafficPermission/web-to-db", "history"},
		{"/?view=policies&mesh=shop", "policies"},
		{"/?view=policies&mesh=shop&policy=TrafficPermission/web-to-db", "policies"},
		{"/?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432", "reach"},
		{"/?view=impact&delete=shop/policies/TrafficPermission/web-to-db", "impact"},
		{"/?view=workload&mesh=shop&workload=db-1", "workload"},
	} {
		b.do(chromedp.Navigate(d.ui + page.query))
		b.waitView(page.view, "token")
		if got := b.text("main [role=alert]"); !strings.Contains(got, "UNAUTHENTICATED") {
			t.Errorf("%s with a refused token: alert %q", page.query, got)
		}
		if got := b.text("main"); strings.Contains(got, "web-1") || strings.Contains(got, "created") || strings.Contains(got, "app=db") {
			t.Errorf("%s with a refused token shows:\n%s", page.query, got)
		}
	}
	b.screenshot("explorer-refused")
	b.noConsoleProblems(refusedLoads)
}

// At 10,000 policies the views read in pages: the policies view lists a
// page of List and a page of the findings, the history view a page of
// versions; the page stays small and every page is reached by a link.
func TestExplorerManyPolicies(t *testing.T) {
	var replicas strings.Builder // 300 replicas of web: a change to web → db alters 2,400 flows
	for i := range 300 {
		fmt.Fprintf(&replicas, "\n---\nkind: Workload\nmesh: shop\nname: web-r%04d\ntags: {app: web, tier: front}\naddresses: [10.2.%d.%d]\n",
			i, i/250, i%250+1)
	}
	_, file := tenThousand(t, replicas.String())
	d := startExplorerWith(t, file)
	b := newBrowser(t)

	b.open(d.ui+"/?view=policies&mesh=shop", "policies")
	first := b.rows("#policies")
	if len(first) != 100 {
		t.Fatalf("the first page lists %d policies, want 100", len(first))
	}
	if got := b.text("#policies-revision"); !strings.HasPrefix(got, "policies 1–100 · page 1") {
		t.Errorf("the first page: %q", got)
	}
	b.do(chromedp.Click(chromedp.ID("policies-next")))
	b.waitFor("the second page's URL", `location.search.includes('after=') && location.search.includes('n=2')`)
	b.waitView("policies", "ready")
	second := b.rows("#policies")
	if len(second) != 100 || second[0][0] <= first[99][0] {
		t.Errorf("the second page: %d policies from %q, after %q", len(second), second[0][0], first[99][0])
	}
	if got := b.text("#policies-revision"); !strings.HasPrefix(got, "policies 101–200 · page 2") {
		t.Errorf("the second page: %q", got)
	}
	// The findings, a page at a time.
	if n := len(b.rows("#findings")); n > 100 {
		t.Errorf("%d findings on one page", n)
	}
	// (the generated set's policies select no workload: each is dead, an info
	// finding, so there are more than 100)
	b.do(chromedp.Click(chromedp.ID("findings-next")))
	b.waitFor("the findings' second page", `location.search.includes('fpage=2')`)
	b.waitView("policies", "ready")
	if got := b.text("nav[aria-label='Pages of findings'] span"); !strings.HasPrefix(got, "findings 101–200 of ") {
		t.Errorf("the findings' second page: %q", got)
	}
	if got := b.text("#policies-revision"); !strings.HasPrefix(got, "policies 101–200 · page 2") {
		t.Errorf("the list's page after the findings' page: %q", got)
	}
	if n := eval[int](b, `document.getElementsByTagName('tr').length`); n > 400 {
		t.Errorf("the policies view holds %d table rows", n)
	}
	if bad := eval[[]string](b, unlabelled); len(bad) > 0 {
		t.Errorf("the policies' pages: without a name: %q", bad)
	}

	// An impact of thousands of flows: a page of 100 under their groups.
	freeze := "kind: Policy\nmesh: shop\nname: freeze-db\npriority: -1\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: db}}]\naction: DENY\n"
	b.open(d.ui+"/?view=impact&doc="+url.QueryEscape(freeze), "impact")
	if got := b.text("#impact-title"); !strings.HasSuffix(got, "flows would change") {
		t.Fatalf("the impact: %q", got)
	}
	if n := len(b.changes()); n != 100 {
		t.Errorf("the impact's first page shows %d changed flows, want 100", n)
	}
	b.do(chromedp.Click(chromedp.ID("impact-changes-next")))
	b.waitFor("the changes' second page", `location.search.includes('cpage=2')`)
	b.waitView("impact", "ready")
	if got := b.text("nav[aria-label='Pages of changed flows'] span"); !strings.HasPrefix(got, "flows 101–200 of ") {
		t.Errorf("the changes' second page: %q", got)
	}
	if n := len(b.changes()); n != 100 {
		t.Errorf("the impact's second page shows %d changed flows, want 100", n)
	}
	if bad := eval[[]string](b, unlabelled); len(bad) > 0 {
		t.Errorf("the impact's pages: without a name: %q", bad)
	}

	// Every version under the mesh: a page of 100, and a link to the next.
	b.open(d.ui+"/?view=history&key=shop/&prefix=1", "history")
	if n := eval[int](b, `document.querySelectorAll('#versions li.version').length`); n != 100 {
		t.Errorf("the mesh's versions: %d on the first page, want 100", n)
	}
	b.do(chromedp.Click(chromedp.ID("history-next")))
	b.waitFor("the versions' second page", `location.search.includes('page=')`)
	b.waitView("history", "ready")
	if n := eval[int](b, `document.querySelectorAll('#versions li.version').length`); n != 100 {
		t.Errorf("the mesh's versions: %d on the second page, want 100", n)
	}
	b.noConsoleProblems(nil)
}

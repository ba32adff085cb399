package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestHistoryEndToEnd: a policy changed from ALLOW to DENY still answers
// ALLOW at the earlier revision (and at the time of that write) and DENY
// now; history shows both versions with their writer; diff of the two
// revisions exits 1; a revert to the earlier revision makes it ALLOW again as
// a new revision; reading the past needs the token.
func TestHistoryEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("e2e-history-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "--auth-token-file", tokenFile)
	waitServing(t, d.conn(t))
	env := []string{"VERDICT_SERVER=" + d.addr, "VERDICT_TOKEN_FILE=" + tokenFile}
	ctl := func(code int, args ...string) string {
		t.Helper()
		r := runTool(t, env, nil, "verdictctl", args...)
		if r.code != code {
			t.Fatalf("verdictctl %s: exit %d, want %d:\n%s", strings.Join(args, " "), r.code, code, r.out)
		}
		return r.out
	}
	write := func(action string) int64 {
		t.Helper()
		doc := filepath.Join(dir, action+".yaml")
		text := "kind: Mesh\nname: default\n---\nkind: Policy\nname: web-to-db\nsources: [{match: {app: web}}]\n" +
			"destinations: [{match: {app: db}}]\naction: " + action + "\n"
		if err := os.WriteFile(doc, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		out := ctl(0, "apply", "-f", doc)
		m := regexp.MustCompile(`(?m)^revision (\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("apply names no revision:\n%s", out)
		}
		rev, _ := strconv.ParseInt(m[1], 10, 64)
		return rev
	}
	flow := []string{"--src", "app=web", "--dst", "app=db"}
	allowed := write("ALLOW")
	denied := write("DENY")
	key := "default/policies/TrafficPermission/web-to-db"

	ctl(0, append([]string{"decide", "--at-revision", strconv.FormatInt(allowed, 10)}, flow...)...)
	ctl(1, append([]string{"decide"}, flow...)...)
	out := ctl(0, append([]string{"decide", "-o", "json", "--at-revision", strconv.FormatInt(allowed, 10)}, flow...)...)
	if !strings.Contains(out, `"revision": "`+strconv.FormatInt(allowed, 10)+`"`) {
		t.Errorf("the answer at a past revision does not echo it:\n%s", out)
	}

	var h struct {
		Versions []struct {
			Revision string `json:"revision"`
			Time     string `json:"time"`
			Writer   string `json:"writer"`
			Change   string `json:"change"`
		} `json:"versions"`
	}
	if err := json.Unmarshal([]byte(ctl(0, "history", key, "-o", "json")), &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Versions) != 2 || h.Versions[0].Change != "VERSION_CHANGE_CREATED" || h.Versions[1].Change != "VERSION_CHANGE_UPDATED" ||
		h.Versions[0].Writer != "token" || h.Versions[1].Writer != "token" || h.Versions[0].Time == "" {
		t.Fatalf("history of %s: %+v", key, h.Versions)
	}
	// At the time the ALLOW version was written, the flow was allowed.
	ctl(0, append([]string{"decide", "--at", h.Versions[0].Time}, flow...)...)
	if text := ctl(0, "history", key, "-o", "wide"); !strings.Contains(text, "-action: ALLOW") || !strings.Contains(text, "+action: DENY") {
		t.Errorf("history -o wide shows no diff from ALLOW to DENY:\n%s", text)
	}
	ctl(1, "diff", "--from-revision", strconv.FormatInt(allowed, 10), "--to-revision", strconv.FormatInt(denied, 10))

	ctl(0, "revert", key, "--to-revision", strconv.FormatInt(allowed, 10))
	ctl(0, append([]string{"decide"}, flow...)...)
	if err := json.Unmarshal([]byte(ctl(0, "history", key, "-o", "json")), &h); err != nil {
		t.Fatal(err)
	}
	last, _ := strconv.ParseInt(h.Versions[len(h.Versions)-1].Revision, 10, 64)
	if len(h.Versions) != 3 || last <= denied {
		t.Errorf("after the revert: %+v, want a third version after revision %d", h.Versions, denied)
	}
	ctl(0, "diff", "--from-revision", strconv.FormatInt(allowed, 10), "--to-revision", strconv.FormatInt(last, 10))

	// The past needs the token; a plain decide does not.
	open := []string{"VERDICT_SERVER=" + d.addr}
	if r := runTool(t, open, nil, "verdictctl", append([]string{"decide", "--at-revision", strconv.FormatInt(allowed, 10)}, flow...)...); r.code != 3 ||
		!strings.Contains(r.out, "Unauthenticated") {
		t.Errorf("decide --at-revision without the token: exit %d\n%s", r.code, r.out)
	}
	if r := runTool(t, open, nil, "verdictctl", append([]string{"decide"}, flow...)...); r.code != 0 {
		t.Errorf("a plain decide without the token: exit %d\n%s", r.code, r.out)
	}
}

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLintEndToEnd: a real verdictd on make run's policies and the
// verdictctl binary. An absolute DENY of everything to the database,
// placed over backend-to-db's ALLOW, is refused by apply --lint=error
// (exit 1, nothing written); applied without it, it is reported as a
// warning; then lint reports backend-to-db shadowed, with a witness flow
// the daemon decided and the covering rule named, and exits 1 — online, in
// JSON, and offline on the documents.
func TestLintEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	waitServing(t, d.conn(t))
	env := []string{"VERDICT_SERVER=" + d.addr}
	lockdown := filepath.Join(dir, "lockdown.yaml")
	doc := "kind: Policy\nname: lockdown-db\nrank: Absolute\naction: DENY\nsources: [{}]\n" +
		"destinations: [{match: {kuma.io/service: db}}]\n"
	if err := os.WriteFile(lockdown, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	shadowed := "error: shadowed default/TrafficPermission backend-to-db sources[0]/destinations[0]"
	cases := []struct {
		name string
		args []string
		code int
		want []string
		not  []string
	}{
		{"the example store has no error", []string{"lint"}, 0, []string{"0 errors"}, []string{"error:"}},
		{"apply --lint=error refuses the lockdown", []string{"apply", "-f", lockdown, "--lint=error"}, 1,
			[]string{"warning: lint error: shadowed default/TrafficPermission backend-to-db", "nothing was written"}, []string{"created"}},
		{"nothing was written", []string{"get", "policy", "lockdown-db"}, 3, nil, nil},
		{"apply warns and writes", []string{"apply", "-f", lockdown}, 0,
			[]string{"warning: lint error: shadowed default/TrafficPermission backend-to-db", "created"}, nil},
		{"lint reports the shadowed rule with its witness and exits 1", []string{"lint"}, 1,
			[]string{shadowed, "lockdown-db sources[0]/destinations[0] decide every flow it matches",
				"witness: {kuma.io/service=backend} -> {kuma.io/service=db} TCP 5432: outbound DENY by lockdown-db"}, nil},
		{"offline on the documents", []string{"lint", "-f", "examples/policies.yaml", "-f", lockdown}, 1, []string{shadowed}, nil},
	}
	for _, tc := range cases {
		r := runTool(t, env, nil, "verdictctl", tc.args...)
		ok := r.code == tc.code
		for _, w := range tc.want {
			ok = ok && strings.Contains(r.out, w)
		}
		for _, w := range tc.not {
			ok = ok && !strings.Contains(r.out, w)
		}
		if !ok {
			t.Fatalf("%s: verdictctl %s: exit %d, want %d with %q, without %q:\n%s", tc.name, strings.Join(tc.args, " "), r.code, tc.code,
				tc.want, tc.not, r.out)
		}
	}
	r := runTool(t, env, nil, "verdictctl", "lint", "--mesh", "default", "--type", "TrafficPermission", "-o", "json")
	var resp struct {
		Revision string
		Findings []struct {
			Kind, Severity, Policy string
			Related                []struct{ Policy string }
			Witness                struct {
				Decided struct{ Policy, Action string }
			}
		}
	}
	if err := json.Unmarshal([]byte(r.out), &resp); err != nil || r.code != 1 {
		t.Fatalf("lint -o json: exit %d, %v:\n%s", r.code, err, r.out)
	}
	found := false
	for _, f := range resp.Findings {
		if f.Kind == "FINDING_KIND_SHADOWED" && f.Policy == "backend-to-db" {
			found = f.Severity == "SEVERITY_ERROR" && len(f.Related) == 1 && f.Related[0].Policy == "lockdown-db" &&
				f.Witness.Decided.Policy == "lockdown-db" && f.Witness.Decided.Action == "ACTION_DENY"
		}
	}
	if !found || resp.Revision == "" {
		t.Fatalf("lint -o json: no shadowed backend-to-db covered by lockdown-db (revision %q):\n%s", resp.Revision, r.out)
	}
}

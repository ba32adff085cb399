package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLintOffline lints documents without a server: exit 1 with an
// error-level finding, 0 without; JSON in the proto3 mapping.
func TestLintOffline(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	allow := "kind: Policy\nname: web-to-db\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: db}}]\n"
	clean := write("clean.yaml", allow)
	shadow := write("shadow.yaml", allow+"---\nkind: Policy\nname: lockdown\nrank: Absolute\naction: DENY\nsources: [{}]\n"+
		"destinations: [{match: {app: db}}]\n")
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no finding", []string{"lint", "-f", clean}, 0, "0 errors"},
		{"a shadowed rule", []string{"lint", "-f", shadow}, 1,
			"error: shadowed default/TrafficPermission web-to-db sources[0]/destinations[0]: never decides a flow: lockdown"},
		{"its witness", []string{"lint", "-f", shadow}, 1, "witness: {app=web} -> {app=db} TCP: outbound DENY by lockdown"},
		{"another mesh", []string{"lint", "-f", shadow, "--mesh", "other"}, 3, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := offline(t, "", c.args...)
			if r.code != c.code || !strings.Contains(r.out, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", r.code, c.code, c.want, r.out, r.errOut)
			}
		})
	}
	r := offline(t, "", "lint", "-f", shadow, "-o", "json")
	var resp struct {
		Findings []struct{ Kind, Severity, Policy string }
	}
	if err := json.Unmarshal([]byte(r.out), &resp); err != nil || r.code != 1 || len(resp.Findings) == 0 ||
		resp.Findings[0].Kind != "FINDING_KIND_SHADOWED" || resp.Findings[0].Severity != "SEVERITY_ERROR" {
		t.Fatalf("exit %d, %v: %s", r.code, err, r.out)
	}
}

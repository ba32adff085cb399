package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDiffRevisionsFlows: diff --from-revision A --to-revision B lists the
// documents that differ and, after them, the workload pairs whose answer
// differs with the answer at each revision; it exits 1 when something
// differs, 0 when nothing does, and -o json carries the flows too.
func TestDiffRevisionsFlows(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	t.Cleanup(func() { c.run(t, "", "delete", "--prefix", "hd/") })
	dir := t.TempDir()
	apply := func(action string) string {
		t.Helper()
		p := filepath.Join(dir, action+".yaml")
		doc := "kind: Workload\nmesh: hd\nname: web-1\ntags: {app: web}\n---\n" +
			"kind: Workload\nmesh: hd\nname: db-1\ntags: {app: db}\n---\n" +
			"kind: Policy\nmesh: hd\nname: web-to-db\nsources: [{match: {app: web}}]\n" +
			"destinations: [{match: {app: db}}]\nports: [{protocol: TCP, ports: \"5432\"}]\naction: " + action + "\n"
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		r := c.run(t, "", "apply", "-f", p, "-o", "json")
		var out struct {
			Calls []struct {
				Revision string `json:"revision"`
			} `json:"calls"`
		}
		if err := json.Unmarshal([]byte(r.out), &out); r.code != exitOK || err != nil || len(out.Calls) != 1 {
			t.Fatalf("apply: %d %v %s %s", r.code, err, r.out, r.errOut)
		}
		if _, err := strconv.ParseInt(out.Calls[0].Revision, 10, 64); err != nil {
			t.Fatalf("apply: revision %q: %v", out.Calls[0].Revision, err)
		}
		return out.Calls[0].Revision
	}
	a := apply("ALLOW")
	b := apply("DENY")
	cases := []struct {
		name string
		args []string
		code int
		want []string
		not  []string
	}{
		{"allow to deny", []string{"diff", "--from-revision", a, "--to-revision", b, "--prefix", "hd/"}, exitFailed,
			[]string{"+action: DENY", "Workload pairs whose answer differs from revision " + a + " (before) to " + b + " (after): 1 flow",
				"web-1 -> db-1", "TCP 5432", "ALLOW (web-to-db)  ->  DENY (web-to-db)", "By policy, destination and ports:"}, nil},
		{"deny back to allow", []string{"diff", "--from-revision", b, "--to-revision", a, "--prefix", "hd/"}, exitFailed,
			[]string{"+action: ALLOW", "DENY (web-to-db)  ->  ALLOW (web-to-db)"}, nil},
		{"-o json", []string{"diff", "--from-revision", a, "--to-revision", b, "--prefix", "hd/", "-o", "json"}, exitFailed,
			[]string{`"flows": {`, `"workload": "web-1"`, `"action": "ACTION_DENY"`, `"groups": [`, `"revision": "` + a + `"`}, nil},
		{"nothing between", []string{"diff", "--from-revision", b, "--to-revision", b, "--prefix", "hd/"}, exitOK,
			nil, []string{"Workload pairs", "web-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := c.run(t, "", tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", r.code, tc.code, r.out, r.errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.out, w) {
					t.Errorf("output lacks %q:\n%s", w, r.out)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(r.out, w) {
					t.Errorf("output has %q:\n%s", w, r.out)
				}
			}
		})
	}
}

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const diffSet = `kind: Mesh
name: df
---
# the web tier may call the API
kind: Policy
mesh: df
name: web-to-api
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
mesh: df
name: log-all
type: TrafficLog
sources: [{}]
destinations: [{}]
conf: {backend: file}
`

// TestUnchangedApplyAndDiff: apply says created, configured or unchanged per
// document; an unchanged apply writes nothing and says so; diff -f shows what
// apply would change and exits 1, or nothing and exits 0; apply --dry-run
// says what each document would do.
func TestUnchangedApplyAndDiff(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	t.Cleanup(func() { c.run(t, "", "delete", "--prefix", "df/") })
	file := filepath.Join(t.TempDir(), "set.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(diffSet)
	steps := []struct {
		name    string
		args    []string
		code    int
		want    []string
		notWant []string
	}{
		{"diff before anything", []string{"diff", "-f", file}, 1,
			[]string{"--- /dev/null", "+++ df/policies/TrafficPermission/web-to-api\t(" + file + ":5)", "+name: web-to-api"}, nil},
		{"first apply", []string{"apply", "-f", file}, 0,
			[]string{"df/mesh created", "df/policies/TrafficPermission/web-to-api created", "df/policies/TrafficLog/log-all created"}, nil},
		{"diff in sync", []string{"diff", "-f", file}, 0, nil, []string{"---", "+++"}},
		{"apply again", []string{"apply", "-f", file}, 0,
			[]string{"df/mesh unchanged", "df/policies/TrafficLog/log-all unchanged", "(nothing changed: nothing was written)"}, []string{"created", "configured"}},
		{"diff -o json in sync", []string{"diff", "-f", file, "-o", "json"}, 0, []string{`"differ": false`, `"outcome": "unchanged"`, `"revision": "`}, nil},
	}
	run := func(steps []struct {
		name    string
		args    []string
		code    int
		want    []string
		notWant []string
	}) {
		for _, s := range steps {
			r := c.run(t, "", s.args...)
			all := r.out + r.errOut
			if r.code != s.code {
				t.Errorf("%s: exit %d, want %d\n%s", s.name, r.code, s.code, all)
			}
			for _, w := range s.want {
				if !strings.Contains(all, w) {
					t.Errorf("%s: no %q in\n%s", s.name, w, all)
				}
			}
			for _, w := range s.notWant {
				if strings.Contains(all, w) {
					t.Errorf("%s: %q in\n%s", s.name, w, all)
				}
			}
		}
	}
	run(steps)
	ts.keys(t, "df/")
	write(strings.Replace(diffSet, "destinations: [{match: {app: api}}]", "destinations: [{match: {app: api}}]\naction: DENY", 1))
	run([]struct {
		name    string
		args    []string
		code    int
		want    []string
		notWant []string
	}{
		{"diff of a change", []string{"diff", "-f", file}, 1,
			[]string{"diff -u df/policies/TrafficPermission/web-to-api configured", "+action: DENY", "@@ "}, []string{"log-all"}},
		{"dry run", []string{"apply", "-f", file, "--dry-run"}, 0,
			[]string{"df/policies/TrafficPermission/web-to-api configured (dry run)", "df/mesh unchanged (dry run)", "dry run: nothing was written"}, nil},
		{"apply the change", []string{"apply", "-f", file}, 0,
			[]string{"df/policies/TrafficPermission/web-to-api configured", "df/policies/TrafficLog/log-all unchanged"}, []string{"nothing changed"}},
		{"apply -o json", []string{"apply", "-f", file, "-o", "json"}, 0,
			[]string{`"dryRun": false`, `"outcome": "APPLY_OUTCOME_UNCHANGED"`, `"revision": "`}, nil},
	})
}

// TestServerErrorsHaveLines: a violation the server finds (a policy naming a
// scope that does not exist) is named by the file, line and column of the
// document's field, as an error verdictctl finds itself would be.
func TestServerErrorsHaveLines(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	for _, tc := range []struct {
		docs string
		want string
	}{
		{"kind: Mesh\nname: se\n---\nkind: Policy\nmesh: se\nname: p\nscope: Nope\nsources: [{}]\ndestinations: [{}]\n",
			`stdin:4:1: documents[1]: scope "Nope" does not exist`},
		{"kind: Mesh\nname: se-strict\nstrictTypes: true\n---\nkind: Policy\nmesh: se-strict\nname: q\n\ntype: TrafficPermision\nsources: [{}]\ndestinations: [{}]\n",
			"stdin:9:1: documents[1].type: "},
	} {
		r := c.run(t, tc.docs, "apply", "-f", "-")
		if r.code != exitError || !strings.Contains(r.errOut, "InvalidArgument:\n  "+tc.want) {
			t.Errorf("exit %d, want 3 and %q:\n%s", r.code, tc.want, r.errOut)
		}
	}
}

// TestWideListAndInspectWording: list -o wide has a MODE column and leaves
// ACTION empty where no action applies; inspect names a workload once.
func TestWideListAndInspectWording(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	if r := c.run(t, cliSet+"---\nkind: Workload\nmesh: cli\nname: cart-1\ntags: {app: cart}\n", "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %s%s", r.out, r.errOut)
	}
	ts.keys(t, "cli/")
	r := c.run(t, "", "list", "cli/", "-o", "wide")
	rows := map[string][]string{}
	for _, l := range strings.Split(r.out, "\n") {
		if f := regexp.MustCompile(`\s{2,}`).Split(l, -1); len(f) > 1 {
			rows[f[0]] = f
		}
	}
	header := rows["KEY"]
	col := func(key, name string) string {
		for i, h := range header {
			if h == name && i < len(rows[key]) {
				return rows[key][i]
			}
		}
		return "?"
	}
	for _, tc := range []struct{ key, mode, action string }{
		{"cli/policies/TrafficPermission/web-to-api", "Enforce", "ALLOW"},
		{"cli/policies/TrafficPermission/tried-deny", "Audit", "DENY"},
	} {
		if m, a := col(tc.key, "MODE"), col(tc.key, "ACTION"); m != tc.mode || a != tc.action {
			t.Errorf("%s: MODE %q ACTION %q, want %q %q\n%s", tc.key, m, a, tc.mode, tc.action, r.out)
		}
	}
	if line := regexp.MustCompile(`(?m)^cli/policies/TrafficLog/log-all .*$`).FindString(r.out); strings.Contains(line, "ALLOW") {
		t.Errorf("a TrafficLog policy shows an action: %s", line)
	}
	r = c.run(t, "", "inspect", "--mesh", "cli", "--workload-name", "cart-1")
	if r.code != 0 || !strings.HasPrefix(r.out, "workload cart-1\n") || strings.Contains(r.out, "workload workload") || strings.Contains(r.out, "[]") {
		t.Errorf("inspect: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
}

// TestWritesReturnOnceServed: apply, delete and revert return once the
// server they wrote through serves their revision, so the next command sees
// the write — on a replica whose watch delivers every event 300 ms late.
func TestWritesReturnOnceServed(t *testing.T) {
	c := ctl{ts: startLagging(t, 300*time.Millisecond)}
	t.Cleanup(func() { c.run(t, "", "delete", "--prefix", "ryw/") })
	doc := "kind: Mesh\nname: ryw\n---\nkind: Policy\nmesh: ryw\nname: p\nsources: [{}]\ndestinations: [{}]\n"
	var created string
	steps := []struct {
		name string
		args func() []string
		code int
		want string
	}{
		{"apply", func() []string { return []string{"apply", "-f", "-"} }, 0, "created"},
		{"get after apply", func() []string { return []string{"get", "policy", "p", "--mesh", "ryw"} }, 0, "name: p"},
		{"delete", func() []string { return []string{"delete", "policy", "p", "--mesh", "ryw"} }, 0, "deleted"},
		{"get after delete", func() []string { return []string{"get", "policy", "p", "--mesh", "ryw"} }, 3, ""},
		{"revert", func() []string { return []string{"revert", "ryw/policies/TrafficPermission/p", "--to-revision", created} }, 0, "reverted"},
		{"get after revert", func() []string { return []string{"get", "policy", "p", "--mesh", "ryw"} }, 0, "name: p"},
	}
	for _, s := range steps {
		r := c.run(t, doc, s.args()...)
		if r.code != s.code || !strings.Contains(r.out, s.want) || strings.Contains(r.errOut, "warning") {
			t.Fatalf("%s: exit %d, want %d with %q (and no warning):\n%s%s", s.name, r.code, s.code, s.want, r.out, r.errOut)
		}
		if m := regexp.MustCompile(`revision (\d+)`).FindStringSubmatch(r.out); s.name == "apply" && m != nil {
			created = m[1]
		}
	}
}

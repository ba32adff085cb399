package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// bigSet is a Mesh, a child scope before its parent, and n policies in the
// child scope: over one call when calls hold fewer than n+3 keys.
func bigSet(mesh string, n int, action string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kind: Scope\nmesh: %s\nname: Apps:Child\nparent: Apps\nselectors: [{match: {tier: child}}]\n", mesh)
	fmt.Fprintf(&b, "---\nkind: Mesh\nname: %s\n", mesh)
	fmt.Fprintf(&b, "---\nkind: Scope\nmesh: %s\nname: Apps\nselectors: [{match: {env: prod}}]\n", mesh)
	for i := range n {
		fmt.Fprintf(&b, "---\nkind: Policy\nmesh: %s\nname: p%d\nscope: Apps:Child\naction: %s\nsources: [{match: {app: s%d}}]\ndestinations: [{match: {app: d%d}}]\n",
			mesh, i, action, i, i)
	}
	return b.String()
}

// put writes documents directly, as another writer would.
func (ts *testServer) put(t testing.TB, docs string) {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(docs))
	if err != nil {
		t.Fatal(err)
	}
	req := &verdictv1.ApplyRequest{}
	for _, r := range rs {
		op := &op{key: r.Key(), res: r}
		pb, err := apiconv.ResourceToProto(op.res)
		if err != nil {
			t.Fatal(err)
		}
		req.Resources = append(req.Resources, pb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.pol.Apply(ctx, req); err != nil {
		t.Fatal(err)
	}
}

func sortedKeys(m map[string]*verdictv1.StoredResource) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestLargeApply: a set over one call's limit is checked whole, written in
// dependency order, and rolled back with guarded writes when a call fails;
// the output says what the store holds (issue 18, finding 2).
func TestLargeApply(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name    string
		mesh    string
		before  string              // written first, by another writer
		hook    func(string) string // documents another writer puts before call 2 (the third)
		dryRun  bool
		bad     bool // one policy of the last call names a scope that does not exist
		code    int
		want    []string // in stdout+stderr
		notWant []string
		keys    []string // what the mesh holds afterwards
		p0      string   // p0's action afterwards
	}{
		{name: "applied in three calls", mesh: "la1", code: 0,
			want: []string{"23 keys do not fit one transaction: writing them in 3 calls", "la1/scopes/Apps:Child created"},
			keys: append([]string{"la1/mesh", "la1/scopes/Apps", "la1/scopes/Apps:Child"}, policyKeys("la1", 20)...)},
		{name: "invalid in the last call: nothing written", mesh: "la2", bad: true, code: 3,
			want:    []string{"the whole set, checked against the server's contents", "stdin:175:1: documents[23]: scope \"Nope\" does not exist", "nothing was written"},
			notWant: []string{"created"}},
		{name: "dry run writes nothing and says so", mesh: "la3", dryRun: true, code: 0,
			want:    []string{"la3/policies/TrafficPermission/p19 created (dry run)", "dry run: nothing was written (the whole set of 23 keys"},
			notWant: []string{"created\n", "\nrevision "}},
		{name: "dry run of an invalid set", mesh: "la4", dryRun: true, bad: true, code: 3, want: []string{"stdin:175:1: documents[23]: scope \"Nope\" does not exist"}},
		{name: "a concurrent write fails the last call: the others are rolled back", mesh: "la5",
			before: "kind: Policy\nmesh: la5\nname: p0\nsources: [{match: {app: old}}]\ndestinations: [{}]\n",
			hook: func(m string) string {
				return "kind: Policy\nmesh: " + m + "\nname: p18\nsources: [{}]\ndestinations: [{}]\n"
			},
			code: 3,
			want: []string{"call 3 of 3 failed", "Aborted", "nothing of call 3 was written", "rolling back the 2 calls",
				"rolled back: every key of the set holds what it held before this apply"},
			keys: []string{"la5/policies/TrafficPermission/p0", "la5/policies/TrafficPermission/p18"}, p0: "ALLOW"},
		{name: "a key changed since is left alone and named", mesh: "la6",
			before: "kind: Policy\nmesh: la6\nname: p0\nsources: [{match: {app: old}}]\ndestinations: [{}]\n",
			hook: func(m string) string {
				return "kind: Policy\nmesh: " + m + "\nname: p18\nsources: [{}]\ndestinations: [{}]\n---\n" +
					"kind: Policy\nmesh: " + m + "\nname: p3\naction: ALLOW\nsources: [{}]\ndestinations: [{}]\n"
			},
			code: 3,
			want: []string{"call 3 of 3 failed", "NOT rolled back: 1 keys of the set differ from before this apply",
				"la6/policies/TrafficPermission/p3: changed by another writer after this apply", "every other key of the set holds what it held before"},
			keys: []string{"la6/policies/TrafficPermission/p0", "la6/policies/TrafficPermission/p18", "la6/policies/TrafficPermission/p3"}, p0: "ALLOW"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != "" {
				ts.put(t, tc.before)
			}
			docs := bigSet(tc.mesh, 20, "DENY")
			if tc.bad {
				docs += "---\nkind: Policy\nmesh: " + tc.mesh + "\nname: bad\nscope: Nope\nsources: [{}]\ndestinations: [{}]\n"
			}
			c := ctl{ts: ts, maxOps: 10}
			if tc.hook != nil {
				c.hook = func(call int) {
					if call == 2 {
						ts.put(t, tc.hook(tc.mesh))
					}
				}
			}
			args := []string{"apply", "-f", "-"}
			if tc.dryRun {
				args = append(args, "--dry-run")
			}
			r := c.run(t, docs, args...)
			all := r.out + r.errOut
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\n%s", r.code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(r.out, w) {
					t.Errorf("stdout has %q:\n%s", w, r.out)
				}
			}
			held := ts.keys(t, tc.mesh+"/")
			want := append([]string(nil), tc.keys...)
			sort.Strings(want)
			if got := sortedKeys(held); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("the store holds\n%v\nwant\n%v", got, want)
			}
			if tc.p0 != "" {
				p := held[tc.mesh+"/policies/TrafficPermission/p0"].GetResource().GetPolicy()
				if got := p.GetAction(); got != tc.p0 && !(tc.p0 == "ALLOW" && got == "") {
					t.Errorf("p0's action is %s, want %s (restored)", got, tc.p0)
				}
				if len(p.GetSources()) != 1 || p.GetSources()[0].GetMatch()["app"] != "old" {
					t.Errorf("p0 was not restored: %v", p)
				}
			}
		})
	}
}

func policyKeys(mesh string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s/policies/TrafficPermission/p%d", mesh, i))
	}
	return out
}

// TestLargeDelete: delete -f and --prefix split like apply, children before
// parents; a key that holds nothing is reported and skipped, or with --strict
// fails the command before anything is deleted.
func TestLargeDelete(t *testing.T) {
	ts := startServer(t)
	dir := t.TempDir()
	tests := []struct {
		name   string
		mesh   string
		args   func(file string) []string
		code   int
		want   []string
		remain int // keys of the mesh left
	}{
		{name: "delete -f with a missing key", mesh: "ld1", args: func(f string) []string { return []string{"delete", "-f", f} },
			want: []string{"ld1/policies/TrafficPermission/missing holds nothing", "in 3 calls", "ld1/mesh deleted"}, remain: 0},
		{name: "--strict deletes nothing", mesh: "ld2", args: func(f string) []string { return []string{"delete", "--strict", "-f", f} },
			code: 3, want: []string{"holds nothing", "--strict: 1 key holds nothing; nothing was deleted"}, remain: 23},
		{name: "--prefix", mesh: "ld3", args: func(string) []string { return []string{"delete", "--prefix", "ld3/"} },
			want: []string{"ld3/scopes/Apps deleted", "in 3 calls"}, remain: 0},
		{name: "--prefix --dry-run", mesh: "ld4", args: func(string) []string { return []string{"delete", "--prefix", "ld4/", "--dry-run"} },
			want: []string{"ld4/scopes/Apps deleted (dry run)", "nothing was written"}, remain: 23},
		// Deleting what holds nothing is done: exit 0, and said; --strict
		// makes it an error.
		{name: "--prefix of nothing", mesh: "ld5", args: func(string) []string { return []string{"delete", "--prefix", "nothing-here/"} },
			code: 0, want: []string{"no key has the prefix"}, remain: 23},
		{name: "--prefix of nothing --strict", mesh: "ld6", args: func(string) []string { return []string{"delete", "--prefix", "nothing-here/", "--strict"} },
			code: 3, want: []string{"no key has the prefix"}, remain: 23},
		{name: "a missing key alone", mesh: "ld7", args: func(string) []string { return []string{"delete", "ld7/policies/TrafficPermission/missing"} },
			code: 0, want: []string{"holds nothing"}, remain: 23},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set := bigSet(tc.mesh, 20, "ALLOW")
			if r := (ctl{ts: ts, maxOps: 10}).run(t, set, "apply", "-f", "-"); r.code != 0 {
				t.Fatalf("apply: %d\n%s%s", r.code, r.out, r.errOut)
			}
			file := filepath.Join(dir, tc.mesh+".yaml")
			extra := "---\nkind: Policy\nmesh: " + tc.mesh + "\nname: missing\nsources: [{}]\ndestinations: [{}]\n"
			if err := os.WriteFile(file, []byte(set+extra), 0o600); err != nil {
				t.Fatal(err)
			}
			r := (ctl{ts: ts, maxOps: 10}).run(t, "", tc.args(file)...)
			all := r.out + r.errOut
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\n%s", r.code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			if got := len(ts.keys(t, tc.mesh+"/")); got != tc.remain {
				t.Errorf("%d keys remain, want %d", got, tc.remain)
			}
		})
	}
}

// TestOrderOps: puts go meshes, scopes parents first, workloads, policies;
// deletes the other way round.
func TestOrderOps(t *testing.T) {
	rs, err := resource.DecodeYAML([]byte(`kind: Policy
name: p
sources: [{}]
destinations: [{}]
---
kind: Scope
name: C
parent: B
selectors: [{}]
---
kind: Workload
name: w
tags: {app: w}
---
kind: Scope
name: B
parent: A
selectors: [{}]
---
kind: Mesh
name: default
---
kind: Scope
name: A
selectors: [{}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var puts, dels []*op
	for _, r := range rs {
		puts = append(puts, &op{key: r.Key(), res: r})
		pb, err := apiconv.ResourceToProto(r)
		if err != nil {
			t.Fatal(err)
		}
		dels = append(dels, &op{key: r.Key(), prior: pb, priorRev: 1})
	}
	names := func(ops []*op) string {
		var s []string
		for _, o := range ops {
			s = append(s, o.key.String())
		}
		return strings.Join(s, " ")
	}
	want := "default/mesh default/scopes/A default/scopes/B default/scopes/C default/workloads/w default/policies/TrafficPermission/p"
	if got := names(orderOps(puts)); got != want {
		t.Errorf("puts:\n%s\nwant\n%s", got, want)
	}
	wantDel := "default/policies/TrafficPermission/p default/workloads/w default/scopes/C default/scopes/B default/scopes/A default/mesh"
	if got := names(orderOps(dels)); got != wantDel {
		t.Errorf("deletes:\n%s\nwant\n%s", got, wantDel)
	}
}

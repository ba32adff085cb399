package main

import (
	"regexp"
	"strings"
	"testing"
)

// get shows a policy's standing conditions as comments, list -o wide in a
// CONDITIONS column (docs/lint.md, "Standing conditions").
func TestConditionsShown(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	const set = `
kind: Mesh
name: condm
---
kind: Policy
mesh: condm
name: backend-to-db
sources: [{match: {app: backend}}]
destinations: [{match: {app: db}}]
---
kind: Policy
mesh: condm
name: lockdown-db
rank: Absolute
action: DENY
sources: [{}]
destinations: [{match: {app: db}}]
`
	if r := c.run(t, set, "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %s%s", r.out, r.errOut)
	}
	ts.keys(t, "condm/")
	r := c.run(t, "", "get", "policy", "backend-to-db", "--mesh", "condm")
	if r.code != 0 || !strings.Contains(r.out, "# conditions: Accepted, Shadowed\n") || !strings.Contains(r.out, "#   Shadowed: no rule of it ever decides a flow") {
		t.Fatalf("get: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	r = c.run(t, "", "status")
	if r.code != 0 || !strings.Contains(r.out, "condm: 2 Accepted, 1 Enforced, 1 Shadowed") {
		t.Fatalf("status: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	r = c.run(t, "", "list", "condm/", "-o", "wide")
	rows := map[string][]string{}
	for _, l := range strings.Split(r.out, "\n") {
		if f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1); len(f) > 1 {
			rows[f[0]] = f
		}
	}
	header := rows["KEY"]
	col := func(key string) string {
		row := rows[key]
		if len(header) == 0 || len(row) == 0 || header[len(header)-1] != "CONDITIONS" {
			return "?"
		}
		return row[len(row)-1]
	}
	for key, want := range map[string]string{
		"condm/policies/TrafficPermission/backend-to-db": "Accepted,Shadowed",
		"condm/policies/TrafficPermission/lockdown-db":   "Accepted,Enforced",
		"condm/mesh": "-",
	} {
		if got := col(key); got != want {
			t.Errorf("%s: CONDITIONS %q, want %q\n%s", key, got, want, r.out)
		}
	}
}

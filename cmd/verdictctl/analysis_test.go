package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// shopWorld is a mesh of its own for the analysis commands' tests.
const shopWorld = `
kind: Policy
mesh: shop
name: backend-to-db
sources: [{match: {app: backend}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
---
kind: Policy
mesh: shop
name: deny-all-to-db
sources: [{match: {app: '*'}}]
destinations: [{match: {app: db}}]
action: DENY
---
kind: Workload
mesh: shop
name: db-1
tags: {app: db}
addresses: [10.9.0.5]
---
kind: Workload
mesh: shop
name: backend-1
tags: {app: backend}
---
kind: Workload
mesh: shop
name: web-1
tags: {app: web}
`

func TestAnalysisCommands(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if r := c.run(t, "", "apply", "-f", write("shop.yaml", shopWorld)); r.code != exitOK {
		t.Fatalf("apply: %d %s", r.code, r.errOut)
	}
	// The replica serves the write once its watch has it: poll, generously.
	deadline := time.Now().Add(time.Minute)
	for c.run(t, "", "decide", "--mesh", "shop", "--src-workload", "backend-1", "--dst-workload", "db-1", "--proto", "TCP", "--port", "5432").code != exitOK {
		if time.Now().After(deadline) {
			t.Fatal("the replica never served the applied world")
		}
		time.Sleep(20 * time.Millisecond)
	}
	denyBackend := write("deny.yaml", "kind: Policy\nmesh: shop\nname: deny-backend\npriority: -1\n"+
		"sources: [{match: {app: backend}}]\ndestinations: [{match: {app: db}}]\naction: DENY\n")
	unrelated := write("unrelated.yaml", "kind: Policy\nmesh: shop\nname: cache\nsources: [{match: {app: cache}}]\n"+
		"destinations: [{match: {app: cache}}]\n")
	flows := write("flows.jsonl", `{"mesh":"shop","type":"TrafficPermission","source":{"workload":"backend-1"},`+
		`"destination":{"address":"10.9.0.5"},"protocol":"TCP","port":5432,"action":"ALLOW"}`+"\n")
	cases := []struct {
		name string
		args []string
		code int
		want []string // in the output
		not  []string
	}{
		{"reach lists the workloads allowed to the database's port",
			[]string{"reach", "--mesh", "shop", "--dst-workload", "db-1", "--proto", "TCP", "--port", "5432"}, exitOK,
			[]string{"Who can reach db-1 on TCP 5432", "backend-1", "backend-to-db"}, []string{"web-1"}},
		{"reach from a source", []string{"reach", "--mesh", "shop", "--src-workload", "backend-1", "--proto", "TCP", "--port", "5432"}, exitOK,
			[]string{"What backend-1 can reach", "db-1"}, []string{"web-1"}},
		{"reach with both ends is a usage error", []string{"reach", "--mesh", "shop", "--src-workload", "web-1", "--dst-workload", "db-1"},
			exitUsage, nil, nil},
		{"reach of an unknown workload", []string{"reach", "--mesh", "shop", "--dst-workload", "nobody"}, exitError, nil, nil},
		{"matrix", []string{"matrix", "--mesh", "shop", "--proto", "TCP", "--port", "5432"}, exitOK,
			[]string{"1 pair", "backend-1", "db-1", "TCP 5432"}, nil},
		{"a deny on an allowed observed flow", []string{"impact", "-f", denyBackend, "--flows", flows}, exitFailed,
			[]string{"backend-1 -> 10.9.0.5", "ALLOW (backend-to-db)", "DENY (deny-backend)", "By policy"}, nil},
		{"only new denials fail with --fail-on deny", []string{"impact", "-f", denyBackend, "--fail-on", "allow"}, exitOK, nil, nil},
		{"an unrelated change", []string{"impact", "-f", unrelated, "--flows", flows}, exitOK, []string{"No flow changes"}, nil},
		{"deleting the permission", []string{"impact", "--delete", "shop/policies/TrafficPermission/backend-to-db", "--fail-on", "deny"}, exitFailed,
			[]string{"backend-1 -> db-1"}, nil},
		{"an invalid change is refused", []string{"impact", "--delete", "shop/scopes/nothing-here", "-f", write("bad.yaml",
			"kind: Policy\nmesh: shop\nname: p\nscope: missing\nsources: [{}]\ndestinations: [{}]\n")}, exitError, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := c.run(t, "", tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tc.code, r.out, r.errOut)
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
	t.Run("reach -o json names workloads and policies", func(t *testing.T) {
		r := c.run(t, "", "reach", "--mesh", "shop", "--dst-workload", "db-1", "--proto", "TCP", "--port", "5432", "-o", "json")
		if r.code != exitOK {
			t.Fatalf("exit %d: %s", r.code, r.errOut)
		}
		var got struct {
			Revision string `json:"revision"`
			Entries  []struct {
				Workload       string `json:"workload"`
				Identity       string `json:"identity"`
				OutboundPolicy string `json:"outboundPolicy"`
			} `json:"entries"`
		}
		if err := json.Unmarshal([]byte(r.out), &got); err != nil {
			t.Fatalf("%v:\n%s", err, r.out)
		}
		if got.Revision == "" || len(got.Entries) != 1 || got.Entries[0].Workload != "backend-1" || got.Entries[0].Identity == "" ||
			got.Entries[0].OutboundPolicy != "backend-to-db" {
			t.Fatalf("%+v", got)
		}
	})
}

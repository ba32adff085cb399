package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoServer: verdictctl is a client of the API, not a second copy of
// the daemon; it reads the wire types and internal/apiconv, never server/ nor
// etcd's server (docs/README.md, the architecture). depguard forbids the
// direct import; this catches one through any package it links.
func TestLinksNoServer(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH to list the dependencies")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps gave %d packages: %q", len(deps), out)
	}
	for _, p := range deps {
		if p == "github.com/verdictpdp/verdict/server" || strings.HasPrefix(p, "github.com/verdictpdp/verdict/server/") ||
			strings.HasPrefix(p, "go.etcd.io/etcd/server/") {
			t.Errorf("verdictctl links %s", p)
		}
	}
}

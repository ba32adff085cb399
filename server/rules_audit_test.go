package server

import (
	"context"
	"testing"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// WatchRules leaves audit rules out unless the client asks for them: a client
// that does not know Rule.audit would enforce them (docs/audit.md).
func TestWatchRulesAuditRulesOnRequest(t *testing.T) {
	b := newBackend(decodeYAML(t, `kind: Mesh
name: default
---
kind: Policy
name: enforced
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: tried
mode: Audit
priority: -1
action: DENY
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
`)...)
	h := start(t, b, nil)
	defer h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := func(audit bool) []*verdictv1.Rule {
		t.Helper()
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("app", "api"), IncludeAudit: audit})
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return m.GetInbound().GetRules()
	}
	names := func(rules []*verdictv1.Rule) (out []string) {
		for _, r := range rules {
			n := r.GetPolicy()
			if r.GetAudit() {
				n += " (audit)"
			}
			out = append(out, n)
		}
		return out
	}
	if got := names(first(false)); len(got) != 1 || got[0] != "enforced" {
		t.Errorf("without include_audit: inbound rules %v, want [enforced]", got)
	}
	if got := names(first(true)); len(got) != 2 || got[0] != "tried (audit)" || got[1] != "enforced" {
		t.Errorf("with include_audit: inbound rules %v, want [tried (audit) enforced]", got)
	}
}

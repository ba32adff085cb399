package analysis_test

import (
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/resource"
)

func lintWorld(t *testing.T, yaml string) *engine.Snapshot {
	t.Helper()
	docs, err := resource.DecodeYAML([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return engine.Build(1, docs)
}

func TestLintScratch(t *testing.T) {
	s := lintWorld(t, `
kind: Policy
name: deny-all-to-db
rank: Absolute
action: DENY
sources: [{}]
destinations: [{match: {app: db}}]
---
kind: Policy
name: web-to-db
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
---
kind: Policy
name: a
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: b
action: DENY
sources: [{match: {env: prod}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: c
sources: [{match: {app: web, env: dev}}]
destinations: [{match: {app: api}}]
`)
	ans, err := analysis.Lint(s, &analysis.LintRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ans.Findings {
		t.Logf("%s %s %s/%s %s %s: %s related=%v witness=%+v", f.Severity, f.Kind, f.Mesh, f.Type, f.Policy, f.Rule, f.Message, f.Related, f.Witness)
	}
	t.Logf("unproven %v notes %v", ans.Unproven, ans.Notes)
	_ = strings.Join
}

package engine_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestAudit checks audit mode (docs/audit.md): audit rules never change the
// enforced answer; the shadow result is reported iff its final action differs.
func TestAudit(t *testing.T) {
	t.Parallel()
	web, api := resource.Tags{"app": "web"}, resource.Tags{"app": "api"}
	cases := []struct {
		name     string
		world    string
		typ      string
		src, dst resource.Tags
		action   resource.Action // enforced
		policy   string          // enforced deciding policy
		audit    *engine.Audit   // nil: the shadow decision agrees
	}{
		{name: "an audit DENY policy over an enforced ALLOW", world: `
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
---
kind: Policy
name: deny-web
mode: Audit
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
action: DENY
`, src: web, dst: api, action: resource.Allow, policy: "allow-all",
			audit: &engine.Audit{Action: resource.Deny, Policy: "deny-web", Rule: "sources[0]/destinations[0]", Side: "inbound"}},
		{name: "an audit policy that does not match: no audit", world: `
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
---
kind: Policy
name: deny-db
mode: Audit
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
action: DENY
`, src: web, dst: api, action: resource.Allow, policy: "allow-all"},
		{name: "an audit policy that agrees with the enforced answer: no audit", world: `
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
---
kind: Policy
name: allow-web
mode: Audit
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{}]
`, src: web, dst: api, action: resource.Allow, policy: "allow-all"},
		{name: "an audit ALLOW over an enforced DENY (defaultAction)", world: `
kind: Policy
name: allow-web
mode: Audit
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: allow-db
sources: [{match: {app: db}}]
destinations: [{}]
`, src: web, dst: api, action: resource.Deny,
			audit: &engine.Audit{Action: resource.Allow, Policy: "allow-web", Rule: "sources[0]/destinations[0]", Side: "inbound"}},
		{name: "an audit scope's policies and catch-all are audit", world: `
kind: Scope
name: apps
selectors: [{match: {app: api}}]
mode: Audit
catchAll: DENY
---
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
`, src: web, dst: api, action: resource.Allow, policy: "allow-all"},
		{name: "an audit scope's catch-all decides the shadow result", world: `
kind: Scope
name: apps
selectors: [{match: {app: api}}]
mode: Audit
catchAll: DENY
---
kind: Scope
name: other
selectors: [{match: {app: db}}]
---
kind: Policy
name: allow-db
scope: other
sources: [{}]
destinations: [{}]
`, src: web, dst: api, action: resource.Allow,
			audit: &engine.Audit{Action: resource.Deny, Scope: "apps", Rule: "catchAll", Side: "inbound"}},
		{name: "a child of an audit scope is audit too", world: `
kind: Scope
name: parent
selectors: [{}]
mode: Audit
---
kind: Scope
name: child
parent: parent
selectors: [{match: {app: api}}]
---
kind: Policy
name: deny-web
scope: child
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
action: DENY
---
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
`, src: web, dst: api, action: resource.Allow, policy: "allow-all",
			audit: &engine.Audit{Action: resource.Deny, Policy: "deny-web", Scope: "child", Rule: "sources[0]/destinations[0]", Side: "inbound"}},
		{name: "an audit scope is not the most specific scope of the enforced decision", world: `
kind: Scope
name: open
selectors: [{}]
enforced: false
---
kind: Scope
name: trial
parent: open
priority: 1
selectors: [{match: {app: api}}]
mode: Audit
catchAll: DENY
`, src: web, dst: api, action: resource.Allow,
			audit: &engine.Audit{Action: resource.Deny, Scope: "trial", Rule: "catchAll", Side: "inbound"}},
		{name: "DenyOverrides: an audit DENY anywhere in order", world: `
kind: Mesh
name: default
types: {TrafficPermission: {combine: DenyOverrides}}
---
kind: Policy
name: allow-web
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: deny-late
mode: Audit
priority: 9
sources: [{}]
destinations: [{}]
action: DENY
`, src: web, dst: api, action: resource.Allow, policy: "allow-web",
			audit: &engine.Audit{Action: resource.Deny, Policy: "deny-late", Rule: "sources[0]/destinations[0]", Side: "inbound"}},
		{name: "an enforced DENY beats an audit ALLOW placed later", world: `
kind: Policy
name: deny-web
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{}]
action: DENY
---
kind: Policy
name: allow-web
mode: Audit
sources: [{match: {app: web}}]
destinations: [{}]
`, src: web, dst: api, action: resource.Deny, policy: "deny-web"},
		{name: "Kuma AllowWithShadowDeny: enforced ALLOW, audit DENY", typ: "MeshTrafficPermission", world: `
type: MeshTrafficPermission
name: mtp
mesh: default
spec:
  targetRef: {kind: Mesh}
  from:
  - targetRef: {kind: MeshSubset, tags: {app: web}}
    default: {action: AllowWithShadowDeny}
`, src: web, dst: api, action: resource.Allow, policy: "mtp",
			audit: &engine.Audit{Action: resource.Deny, Policy: "mtp", Rule: "from[0]", Side: "inbound"}},
		{name: "no audit in the mesh: the plain answer", world: `
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
`, src: web, dst: api, action: resource.Allow, policy: "allow-all"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			snap := engine.Build(1, mustYAML(t, tc.world))
			if inv := snap.Invalid(); len(inv) > 0 {
				t.Fatalf("invalid: %v", inv[0].Err)
			}
			req := engine.Request{Type: tc.typ, Source: tc.src, Destination: tc.dst}
			for try := 0; try < 3; try++ { // the third answer comes from the cache
				d, err := snap.Decide(&req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Action != tc.action || d.Policy != tc.policy {
					t.Fatalf("enforced %s by %q, want %s by %q (%+v)", d.Action, d.Policy, tc.action, tc.policy, d)
				}
				if !reflect.DeepEqual(d.Audit, tc.audit) {
					t.Fatalf("audit %+v, want %+v", d.Audit, tc.audit)
				}
			}
			req.Explain = true
			d, err := snap.Decide(&req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.Audit, tc.audit) {
				t.Fatalf("with explain: audit %+v, want %+v", d.Audit, tc.audit)
			}
		})
	}
}

// TestAuditExplainResolveRules checks that explain lists audit rules marked,
// Resolve leaves audit policies out and lists them as Audit, and WatchRules
// marks them.
func TestAuditExplainResolveRules(t *testing.T) {
	t.Parallel()
	snap := engine.Build(1, mustYAML(t, `
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
---
kind: Policy
name: deny-web
mode: Audit
rank: Absolute
sources: [{match: {app: web}}]
destinations: [{}]
action: DENY
---
kind: Policy
name: timeout
type: MeshTimeout
targetRef: {kind: Mesh}
from: [{targetRef: {kind: Mesh}, conf: {idleTimeout: 10s}}]
---
kind: Policy
name: timeout-trial
type: MeshTimeout
mode: Audit
targetRef: {kind: Mesh}
from: [{targetRef: {kind: Mesh}, conf: {idleTimeout: 1s}}]
`))
	web, api := resource.Tags{"app": "web"}, resource.Tags{"app": "api"}
	d, err := snap.Decide(&engine.Request{Source: web, Destination: api, Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	cands := d.Explain.Inbound.Candidates
	if len(cands) != 2 || cands[0].Policy != "deny-web" || !cands[0].Audit || cands[0].Decided ||
		cands[1].Policy != "allow-all" || cands[1].Audit || !cands[1].Decided {
		t.Fatalf("explain candidates: %+v", cands)
	}
	res, err := snap.Resolve(&engine.ResolveRequest{Type: "MeshTimeout", Source: web, Destination: api})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Main.RuleValues(); !reflect.DeepEqual(got, resource.Object{"idleTimeout": "10s"}) {
		t.Fatalf("resolve rules %v, want the enforced policy's", got)
	}
	if got := res.Main.StatusMap(); !reflect.DeepEqual(got, resource.Object{"timeout": "Enforced", "timeout-trial": "Audit"}) {
		t.Fatalf("resolve status %v", got)
	}
	rs, err := snap.RulesFor("", "", web)
	if err != nil {
		t.Fatal(err)
	}
	var marks []string
	for _, r := range rs.Outbound.Rules {
		marks = append(marks, fmt.Sprintf("%s:%v", r.Policy, r.Audit))
	}
	if got := strings.Join(marks, " "); got != "deny-web:true allow-all:false" {
		t.Fatalf("outbound rules %s", got)
	}
}

// TestAuditDecodeEncode checks the mode field: read, refused when unknown
// (naming the field), and written back.
func TestAuditDecodeEncode(t *testing.T) {
	t.Parallel()
	_, err := resource.DecodeYAML([]byte("kind: Policy\nname: p\nmode: Shadow\nsources: [{}]\ndestinations: [{}]\n"))
	if err == nil || !strings.Contains(err.Error(), "mode") {
		t.Fatalf("mode Shadow: %v, want an error naming mode", err)
	}
	for _, doc := range []string{
		"kind: Policy\nname: p\nmode: Audit\nsources: [{}]\ndestinations: [{}]\n",
		"kind: Scope\nname: s\nmode: Audit\nselectors: [{}]\n",
		"kind: Policy\nname: p\ntype: MeshTrafficPermission\ntargetRef: {kind: Mesh}\nfrom: [{targetRef: {kind: Mesh}, action: AllowWithShadowDeny}]\n",
	} {
		rs := mustYAML(t, doc)
		b, err := resource.EncodeJSON(rs[0])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"mode":"Audit"`) && !strings.Contains(string(b), `"AllowWithShadowDeny"`) {
			t.Fatalf("encoded without its audit: %s", b)
		}
		back, err := resource.DecodeJSON(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(resource.DocumentOf(back), resource.DocumentOf(rs[0])) {
			t.Fatalf("round trip changed %s", b)
		}
	}
	rs := mustYAML(t, "kind: Policy\nname: p\nmode: Enforce\nsources: [{}]\ndestinations: [{}]\n")
	if p := rs[0].(*resource.Policy); p.Mode != resource.ModeEnforce {
		t.Fatalf("mode Enforce read as %v", p.Mode)
	}
}

// TestAuditEqualsDeletion is the differential check: with some policies and
// scopes in audit mode, the enforced answer equals the answer of the same
// world with them (and an audit scope's children and policies) deleted, and
// the shadow result is the answer of the world with every mode Enforce,
// reported iff its action differs.
func TestAuditEqualsDeletion(t *testing.T) {
	t.Parallel()
	n := 1500
	if testing.Short() {
		n = 200
	}
	audits := 0
	for i := 0; i < n; i++ {
		audits += checkAuditWorld(t, seedBytes(100000+i))
	}
	if audits == 0 {
		t.Fatal("no generated flow had a differing shadow result: the check checked nothing")
	}
}

func checkAuditWorld(t *testing.T, data []byte) int {
	c := newChoices(data)
	world := genWorld(c)
	auditScopes := map[string]bool{}
	var withAudit, deleted []resource.Resource
	for _, r := range world {
		switch v := r.(type) {
		case *resource.Scope:
			if auditScopes[v.Parent] || c.chance(20) {
				auditScopes[v.Name] = true
				if !auditScopes[v.Parent] {
					s := *v
					s.Mode = resource.ModeAudit
					withAudit = append(withAudit, &s)
					continue
				}
			}
		case *resource.Policy:
			if auditScopes[v.Scope] || c.chance(25) {
				if !auditScopes[v.Scope] {
					p := *v
					p.Mode = resource.ModeAudit
					withAudit = append(withAudit, &p)
					continue
				}
				withAudit = append(withAudit, r)
				continue
			}
		}
		withAudit = append(withAudit, r)
		if s, ok := r.(*resource.Scope); !ok || !auditScopes[s.Name] {
			deleted = append(deleted, r)
		}
	}
	// Scopes come before their children in genWorld, so the marks above are
	// complete; a policy in an audit scope was kept out of deleted.
	sa, sd, se := engine.Build(1, withAudit), engine.Build(1, deleted), engine.Build(1, world)
	if c.chance(50) {
		// the same world applied one change at a time, policies first
		sa = engine.Empty()
		for i, r := range withAudit {
			if _, ok := r.(*resource.Policy); ok {
				sa = sa.Apply(int64(i+1), []engine.Change{engine.Put(r)})
			}
		}
		for i, r := range withAudit {
			if _, ok := r.(*resource.Policy); !ok {
				sa = sa.Apply(int64(len(withAudit)+i+1), []engine.Change{engine.Put(r)})
			}
		}
		for _, r := range withAudit {
			if p, ok := r.(*resource.Policy); ok && p.Mode == resource.ModeAudit {
				sa = sa.Apply(sa.Revision()+1, []engine.Change{engine.Put(r)}) // rewritten: an incremental update
			}
		}
	}
	found := 0
	for i := 0; i < 40; i++ {
		req := genRequest(c)
		var got engine.Decision
		var err error
		for try := 0; try < 3 && err == nil; try++ {
			got, err = sa.Decide(&req)
		}
		want, werr := sd.Decide(&req)
		full, ferr := se.Decide(&req)
		if err != nil || werr != nil || ferr != nil {
			if (err == nil) != (ferr == nil) {
				t.Fatalf("errors differ: audit world %v, world %v", err, ferr)
			}
			continue // a type only the audit policies made known
		}
		audit := got.Audit
		got.Audit = nil
		if !sameDecision(got, want) {
			t.Fatalf("enforced answer differs from the world without audit resources\nrequest: %+v\naudit world: %+v\ndeleted:     %+v\nresources: %s",
				req, got, want, describe(withAudit))
		}
		var wantAudit *engine.Audit
		if full.Action != got.Action {
			sd, side := full.Inbound, "inbound"
			if deciderIsOutbound(full) {
				sd, side = full.Outbound, "outbound"
			}
			wantAudit = &engine.Audit{Action: full.Action, Policy: sd.Policy, Scope: sd.Scope, Rule: sd.Rule, Side: side}
			found++
		}
		if !reflect.DeepEqual(audit, wantAudit) {
			t.Fatalf("audit %+v, want %+v (the answer with every mode Enforce: %+v)\nrequest: %+v\nresources: %s",
				audit, wantAudit, full, req, describe(withAudit))
		}
	}
	return found
}

// deciderIsOutbound restates docs/order.md: the denying side if exactly one
// denies, otherwise the inbound side, or the outbound side when the inbound
// side was decided by no rule.
func deciderIsOutbound(d engine.Decision) bool {
	denies := func(s engine.SideDecision) bool {
		return s.Reason != engine.ReasonNotApplicable && s.Action == resource.Deny
	}
	if denies(d.Outbound) != denies(d.Inbound) {
		return denies(d.Outbound)
	}
	return d.Inbound.Reason != engine.ReasonMatched && d.Inbound.Reason != engine.ReasonCatchAll
}

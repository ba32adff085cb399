package engine

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
)

// TestRulesImpact: whenever a change alters a workload's rule list, the
// impact says it may (never a false "no"); and a policy that selects one
// workload leaves the others out.
func TestRulesImpact(t *testing.T) {
	t.Parallel()
	base := `
kind: Mesh
name: default
---
kind: Scope
name: prod
selectors: [{match: {env: prod}}]
---
kind: Policy
name: web-to-db
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
---
kind: Policy
name: all-to-api
sources: [{match: {app: '*'}}]
destinations: [{match: {app: api}}]
---
kind: Policy
name: to-items
type: MeshTimeout
targetRef: {kind: MeshService, name: api}
to: [{targetRef: {kind: Mesh}, default: {idleTimeout: 1s}}]
---
kind: Mesh
name: skip
invalidResources: Skip
---
kind: Policy
mesh: skip
name: a
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
`
	workloads := []resource.Tags{{"app": "web"}, {"app": "db"}, {"app": "api"}, {"app": "cache"},
		{"app": "web", "env": "prod"}, {"app": "db", "env": "prod"}, {"kuma.io/service": "api"}, {}}
	key := func(mesh, typ, name string) resource.Key {
		return resource.Key{Kind: resource.KindPolicy, Mesh: mesh, Type: typ, Name: name}
	}
	tests := []struct {
		name    string
		mesh    string
		typ     string
		changes string          // YAML of puts
		deletes []resource.Key  // and deletes
		precise map[string]bool // app → May, for the workloads with only an app tag
	}{
		{name: "a policy selecting one destination", changes: "kind: Policy\nname: to-cache\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: cache}}]\n",
			precise: map[string]bool{"web": true, "cache": true, "db": false, "api": false}},
		{name: "a policy's action flipped", changes: "kind: Policy\nname: web-to-db\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: db}}]\naction: DENY\n",
			precise: map[string]bool{"web": true, "db": true, "cache": false, "api": false}},
		{name: "a policy moved to other workloads", changes: "kind: Policy\nname: web-to-db\nsources: [{match: {app: cache}}]\ndestinations: [{match: {app: api}}]\n",
			precise: map[string]bool{"web": true, "db": true, "cache": true, "api": true}},
		{name: "a policy deleted", deletes: []resource.Key{key("default", "TrafficPermission", "all-to-api")}},
		{name: "a scope's catch-all", changes: "kind: Scope\nname: prod\nselectors: [{match: {env: prod}}]\ncatchAll: DENY\n",
			precise: map[string]bool{"web": true, "cache": true}},
		{name: "the first policy of a type", typ: "MeshHealthCheck",
			changes: "kind: Policy\nname: hc\ntype: MeshHealthCheck\ntargetRef: {kind: MeshService, name: db}\nto: [{targetRef: {kind: Mesh}, default: {interval: 1s}}]\n"},
		{name: "a targetRef policy", typ: "MeshTimeout",
			changes: "kind: Policy\nname: to-db\ntype: MeshTimeout\ntargetRef: {kind: MeshService, name: db}\nto: [{targetRef: {kind: Mesh}, default: {idleTimeout: 2s}}]\n"},
		{name: "the last policy of a type", typ: "MeshTimeout", deletes: []resource.Key{key("default", "MeshTimeout", "to-items")}},
		{name: "forms mixed in a Skip mesh", mesh: "skip",
			changes: "kind: Policy\nmesh: skip\nname: b\ntargetRef: {kind: Mesh}\nfrom: [{targetRef: {kind: Mesh}, default: {action: DENY}}]\n"},
		{name: "a workload", changes: "kind: Workload\nname: c1\ntags: {app: cache}\naddresses: [10.0.0.1]\n",
			precise: map[string]bool{"web": false, "cache": false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs, err := resource.DecodeYAML([]byte(base))
			if err != nil {
				t.Fatal(err)
			}
			prev := Build(1, rs)
			var changes []Change
			if tc.changes != "" {
				puts, err := resource.DecodeYAML([]byte(tc.changes))
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range puts {
					changes = append(changes, Put(r))
				}
			}
			for _, k := range tc.deletes {
				changes = append(changes, Delete(k))
			}
			next := prev.Apply(2, changes)
			ri := next.RulesImpact(prev, changes)
			mesh, typ := tc.mesh, tc.typ
			for _, w := range workloads {
				a, errA := prev.RulesFor(mesh, typ, w)
				b, errB := next.RulesFor(mesh, typ, w)
				changed := fmt.Sprint(errA) != fmt.Sprint(errB) || !a.Equal(b)
				if changed && !ri.May(mesh, typ, w) {
					t.Errorf("%v: the rules changed, the impact says they cannot", w)
				}
				if app, ok := w["app"]; ok && len(w) == 1 {
					if want, ok := tc.precise[app]; ok && ri.May(mesh, typ, w) != want {
						t.Errorf("%v: May = %v, want %v", w, !want, want)
					}
				}
			}
		})
	}
}

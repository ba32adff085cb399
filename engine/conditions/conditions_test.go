package conditions_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/resource"
)

func decode(t *testing.T, y string) []resource.Resource {
	t.Helper()
	res, err := resource.DecodeYAML([]byte(y))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return res
}

// names renders a policy's conditions as "Accepted,Enforced".
func names(cs []conditions.Condition) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Kind.String())
	}
	return strings.Join(out, ",")
}

const base = `
kind: Mesh
name: default
defaultAction: DENY
---
kind: Policy
name: backend-to-db
sources: [{match: {kuma.io/service: backend}}]
destinations: [{match: {kuma.io/service: db}}]
---
kind: Policy
name: web-to-backend
sources: [{match: {kuma.io/service: web}}]
destinations: [{match: {kuma.io/service: backend}}, {match: {kuma.io/service: db}}]
---
kind: Workload
name: web-1
tags: {kuma.io/service: web}
---
kind: Workload
name: backend-1
tags: {kuma.io/service: backend}
---
kind: Workload
name: db-1
tags: {kuma.io/service: db}
`

const lockdown = `
kind: Policy
name: lockdown-db
rank: Absolute
action: DENY
sources: [{}]
destinations: [{match: {kuma.io/service: db}}]
`

func TestConditions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		world string
		typ   string
		want  map[string]string // policy → conditions
	}{
		{
			name:  "every rule decides: enforced",
			world: base,
			want:  map[string]string{"backend-to-db": "Accepted,Enforced", "web-to-backend": "Accepted,Enforced"},
		},
		{
			name:  "an absolute deny shadows every rule of one policy and one rule of another",
			world: base + "---" + lockdown,
			want: map[string]string{"backend-to-db": "Accepted,Shadowed", "web-to-backend": "Accepted,PartiallyEnforced",
				"lockdown-db": "Accepted,Enforced"},
		},
		{
			name: "a policy naming an unknown scope is invalid",
			world: base + `---
kind: Policy
name: scoped
scope: nowhere
sources: [{}]
destinations: [{}]
`,
			// An invalid policy closes its mesh and type: nothing there is enforced.
			want: map[string]string{"scoped": "Invalid", "backend-to-db": "Accepted"},
		},
		{
			name: "an audit policy",
			world: base + `---
kind: Policy
name: trial
mode: Audit
action: DENY
sources: [{}]
destinations: [{match: {kuma.io/service: db}}]
`,
			want: map[string]string{"trial": "Accepted,Audit", "backend-to-db": "Accepted,Enforced"},
		},
		{
			name: "a policy that selects no workload",
			world: base + `---
kind: Policy
name: payments
sources: [{match: {kuma.io/service: payments-api}}]
destinations: [{match: {kuma.io/service: payments}}]
`,
			want: map[string]string{"payments": "Accepted,Enforced,NoWorkloads", "backend-to-db": "Accepted,Enforced"},
		},
		{
			name: "configuration: the older atomic default is overridden, the newer enforced",
			typ:  "AuthPolicy",
			world: `
kind: Mesh
name: default
tieBreak: NewestCreated
---
kind: Workload
name: gw-1
tags: {gateway: gw, kuma.io/service: route}
---
kind: Policy
name: gw-old
type: AuthPolicy
targetRef: {kind: MeshSubset, tags: {gateway: gw}}
defaults: {strategy: atomic, rules: {a: red}}
creationTime: '2024-01-01T00:00:00Z'
---
kind: Policy
name: gw-new
type: AuthPolicy
targetRef: {kind: MeshSubset, tags: {gateway: gw}}
defaults: {strategy: atomic, rules: {a: blue}}
creationTime: '2024-01-02T00:00:00Z'
`,
			want: map[string]string{"gw-old": "Accepted,Overridden", "gw-new": "Accepted,Enforced"},
		},
		{
			name: "configuration: a merge override loses one rule of two",
			typ:  "AuthPolicy",
			world: `
kind: Mesh
name: default
tieBreak: NewestCreated
---
kind: Workload
name: gw-1
tags: {gateway: gw, kuma.io/service: route}
---
kind: Policy
name: gw-old
type: AuthPolicy
targetRef: {kind: MeshSubset, tags: {gateway: gw}}
overrides: {strategy: merge, rules: {a: red, b: red}}
creationTime: '2024-01-01T00:00:00Z'
---
kind: Policy
name: gw-new
type: AuthPolicy
targetRef: {kind: MeshSubset, tags: {gateway: gw}}
overrides: {strategy: merge, rules: {a: blue, c: blue}}
creationTime: '2024-01-02T00:00:00Z'
`,
			want: map[string]string{"gw-old": "Accepted,Enforced", "gw-new": "Accepted,PartiallyEnforced"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := engine.Build(1, decode(t, tc.world))
			tr := conditions.NewTracker()
			p, err := tr.Partition(s, "", tc.typ)
			if err != nil {
				t.Fatal(err)
			}
			for policy, want := range tc.want {
				cs, ok := p.Policy(policy)
				if !ok {
					t.Fatalf("%s: no conditions", policy)
				}
				if got := names(cs); got != want {
					t.Errorf("%s: conditions %s, want %s (%+v)", policy, got, want, cs)
				}
				for _, c := range cs {
					if c.Message == "" {
						t.Errorf("%s %s: no message", policy, c.Kind)
					}
				}
			}
		})
	}
}

// A change moves the conditions, in both directions, and the snapshot
// before keeps its own.
func TestConditionsMoveWithAChange(t *testing.T) {
	t.Parallel()
	s1 := engine.Build(1, decode(t, base))
	tr := conditions.NewTracker()
	lock := decode(t, lockdown)[0]
	s2 := s1.Apply(2, []engine.Change{engine.Put(lock)})
	s3 := s2.Apply(3, []engine.Change{engine.Delete(lock.Key())})
	want := []string{"Accepted,Enforced", "Accepted,Shadowed", "Accepted,Enforced"}
	for i, s := range []*engine.Snapshot{s1, s2, s3} {
		cs, ok := tr.Policy(s, "", "", "backend-to-db")
		if !ok || names(cs) != want[i] {
			t.Fatalf("revision %d: backend-to-db %s, want %s", s.Revision(), names(cs), want[i])
		}
	}
	if cs, _ := tr.Policy(s2, "", "", "backend-to-db"); names(cs) != want[1] {
		t.Fatalf("revision 2 asked again: %s", names(cs))
	}
	// The metric's counts follow.
	counts := tr.Counts(s2)
	i := slices.IndexFunc(counts, func(c conditions.Count) bool { return c.Kind == conditions.Shadowed })
	if i < 0 || counts[i].Policies != 1 || counts[i].Mesh != "default" {
		t.Fatalf("counts at revision 2: %+v", counts)
	}
	// A workload appearing moves NoWorkloads.
	pay := decode(t, `
kind: Policy
name: payments
sources: [{match: {kuma.io/service: payments-api}}]
destinations: [{match: {kuma.io/service: payments}}]
`)[0]
	s4 := s3.Apply(4, []engine.Change{engine.Put(pay)})
	w := decode(t, "kind: Workload\nname: pay-1\ntags: {kuma.io/service: payments}\n")[0]
	s5 := s4.Apply(5, []engine.Change{engine.Put(w)})
	for s, want := range map[*engine.Snapshot]string{s4: "Accepted,Enforced,NoWorkloads", s5: "Accepted,Enforced"} {
		if cs, _ := tr.Policy(s, "", "", "payments"); names(cs) != want {
			t.Fatalf("revision %d: payments %s, want %s", s.Revision(), names(cs), want)
		}
	}
}

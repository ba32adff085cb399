package writeplan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
)

func TestSplit(t *testing.T) {
	var docs []string
	for i := range 300 {
		docs = append(docs, fmt.Sprintf("kind: Policy\nname: p%d\nscope: s\nsources: [{}]\ndestinations: [{}]", i))
	}
	docs = append(docs, "kind: Scope\nname: s\nselectors: [{}]", "kind: Mesh\nname: default")
	rs, err := resource.DecodeYAML([]byte(strings.Join(docs, "\n---\n")))
	if err != nil {
		t.Fatal(err)
	}
	parts := Split(rs, 0)
	if len(parts) != 3 || len(parts[0]) != 128 || len(parts[2]) != 302-256 {
		t.Fatalf("parts of %d, %d, ...", len(parts[0]), len(parts[1]))
	}
	if parts[0][0].Key().Kind != resource.KindMesh || parts[0][1].Key().Kind != resource.KindScope {
		t.Errorf("meshes and scopes do not come first: %v, %v", parts[0][0].Key(), parts[0][1].Key())
	}
	if got := Split(rs[:5], 10); len(got) != 1 || len(got[0]) != 5 {
		t.Errorf("a small write was split: %d parts", len(got))
	}
	big := strings.Repeat("x", 200_000)
	var bigDocs []string
	for i := range 10 {
		bigDocs = append(bigDocs, fmt.Sprintf("kind: Policy\nname: b%d\nsources: [{}]\ndestinations: [{}]\nconf: {blob: %s}", i, big))
	}
	brs, err := resource.DecodeYAML([]byte(strings.Join(bigDocs, "\n---\n")))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Split(brs, 0) {
		if len(p)*200_000 > MaxBytes {
			t.Errorf("a part of %d large resources exceeds %d bytes", len(p), MaxBytes)
		}
	}
}

// TestOrder: meshes, scopes parents first (a child given before its parent),
// workloads, policies.
func TestOrder(t *testing.T) {
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
kind: Scope
name: A
selectors: [{}]
---
kind: Mesh
name: default
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range Order(rs) {
		got = append(got, r.Key().String())
	}
	want := "default/mesh default/scopes/A default/scopes/B default/scopes/C default/workloads/w default/policies/TrafficPermission/p"
	if strings.Join(got, " ") != want {
		t.Errorf("order:\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// TestSame: documents equal but for what the store stamps are the same; any
// other difference, or a missing side, is not.
func TestSame(t *testing.T) {
	decode := func(s string) resource.Resource {
		t.Helper()
		rs, err := resource.DecodeYAML([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	base := "kind: Policy\nname: p\nsources: [{match: {app: web}}]\ndestinations: [{}]\n"
	stamped := decode(base + "creationTime: 2026-01-02T03:04:05Z\nmodificationTime: 2026-02-02T03:04:05Z\n")
	m := stamped.Metadata()
	m.CreateRevision, m.ModRevision = 3, 9
	stamped = stamped.WithMeta(m)
	tests := []struct {
		name string
		a, b resource.Resource
		want bool
	}{
		{"times and revisions aside", stamped, decode(base), true},
		{"a Kuma document and its native form", decode("type: MeshTrafficPermission\nname: k\nspec:\n  targetRef: {kind: Mesh}\n  from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]\n"),
			decode("type: MeshTrafficPermission\nname: k\nspec:\n  targetRef: {kind: Mesh}\n  from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]\n"), true},
		{"another action", decode(base), decode(base + "action: DENY\n"), false},
		{"another selector", decode(base), decode("kind: Policy\nname: p\nsources: [{match: {app: api}}]\ndestinations: [{}]\n"), false},
		{"nothing stored", nil, decode(base), false},
	}
	for _, tc := range tests {
		if got := Same(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

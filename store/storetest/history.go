package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// World says what random writes (RandomWrite) may write besides the one
// mesh's settings, its two scopes and policies between a few apps.
type World struct {
	// Workloads: workloads w0 to w5 of those apps, in either environment,
	// some with tags for the database port.
	Workloads bool
	// Ports: policies on a port or a range of ports, TCP or UDP.
	Ports bool
	// Profiles: the Mesh sets a profile (Kuma, KongMesh) or a tie-break.
	Profiles bool
}

// The small world's names.
var (
	randomApps    = []string{"web", "api", "db", "cache"}
	randomEnvs    = []string{"prod", "dev"}
	randomActions = []string{"ALLOW", "DENY"}
	randomPorts   = []string{"80", "443", "5432", "8000-8099", "53"}
)

// RandomDoc is a random document of w's small world.
func RandomDoc(r *rand.Rand, w World) string {
	kinds := 10
	if w.Workloads {
		kinds = 13
	}
	switch n := r.IntN(kinds); {
	case n == 0:
		mesh := fmt.Sprintf("kind: Mesh\nname: default\ndefaultAction: %s\n", randomActions[r.IntN(2)])
		if w.Profiles {
			mesh += []string{"", "profile: Kuma\n", "profile: KongMesh\n", "tieBreak: NewestModified\n", "tieBreak: NewestCreated\n"}[r.IntN(5)]
		}
		return mesh
	case n == 1:
		return fmt.Sprintf("kind: Scope\nname: s%d\nselectors: [{match: {env: %s}}]\ncatchAll: %s\n", r.IntN(2), randomEnvs[r.IntN(2)], randomActions[r.IntN(2)])
	case n >= 10:
		doc := fmt.Sprintf("kind: Workload\nname: w%d\ntags: {app: %s, env: %s}\n", r.IntN(6), randomApps[r.IntN(4)], randomEnvs[r.IntN(2)])
		if r.IntN(3) == 0 {
			doc += "ports: [{port: 5432, tags: {role: primary}}]\n"
		}
		return doc
	}
	scope := ""
	if r.IntN(3) == 0 {
		scope = fmt.Sprintf("scope: s%d\n", r.IntN(2))
	}
	doc := fmt.Sprintf("kind: Policy\nname: p%d\n%ssources: [{match: {app: %s}}]\ndestinations: [{match: {app: %s}}]\naction: %s\n",
		r.IntN(8), scope, randomApps[r.IntN(4)], randomApps[r.IntN(4)], randomActions[r.IntN(2)])
	if w.Ports && r.IntN(2) == 0 {
		doc += fmt.Sprintf("ports: [{protocol: %s, ports: %q}]\n", []string{"TCP", "UDP"}[r.IntN(2)], randomPorts[r.IntN(len(randomPorts))])
	}
	return doc
}

// RandomWrite is one random write of w's small world: one to three puts or
// deletes of distinct keys. The store may refuse it (a scope in use, a
// policy naming a missing scope).
func RandomWrite(t testing.TB, r *rand.Rand, w World) []store.Op {
	t.Helper()
	var ops []store.Op
	for range 1 + r.IntN(3) {
		doc, err := resource.DecodeYAML([]byte(RandomDoc(r, w)))
		if err != nil {
			t.Fatal(err)
		}
		op := store.Op{Key: doc[0].Key(), Resource: doc[0]}
		if r.IntN(4) == 0 {
			op.Resource = nil
		}
		if !slices.ContainsFunc(ops, func(o store.Op) bool { return o.Key == op.Key }) {
			ops = append(ops, op)
		}
	}
	return ops
}

package engine_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The world every case starts from: two meshes, each allowing web → backend
// for TrafficPermission and logging it for TrafficLog.
const invalidWorld = `
kind: Policy
name: allow
sources: [{match: {svc: web}}]
destinations: [{match: {svc: backend}}]
---
kind: Policy
name: log
type: TrafficLog
sources: [{match: {svc: web}}]
destinations: [{match: {svc: backend}}]
conf: {backend: file}
---
kind: Policy
mesh: other
name: allow
sources: [{match: {svc: web}}]
destinations: [{match: {svc: backend}}]
`

func mustYAML(t *testing.T, doc string) []resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// broken is a stored value that failed to decode, at path (without prefix).
func broken(path string) engine.Change {
	c := engine.Change{Path: path, Err: fmt.Errorf("%w: unknown field %q", resource.ErrInvalid, "fromTheFuture"),
		Value: []byte(`{"fromTheFuture":1}`), ModRevision: 9}
	if k, err := resource.ParseKey(path); err == nil {
		c.Key = k
	}
	return c
}

func puts(rs []resource.Resource) []engine.Change {
	out := make([]engine.Change, len(rs))
	for i, r := range rs {
		out[i] = engine.Put(r)
	}
	return out
}

// TestInvalidStoredFailsClosed checks docs/storage.md ("Invalid stored
// values"): per case, which (mesh, type) pairs answer DENY with reason
// INVALID_RESOURCE on both sides, deny-all rules and FAILED_PRECONDITION from
// Resolve, and that every other pair still decides as before.
func TestInvalidStoredFailsClosed(t *testing.T) {
	type mt struct{ mesh, typ string }
	all := []mt{{"default", "TrafficPermission"}, {"default", "TrafficLog"}, {"other", "TrafficPermission"}}
	cases := []struct {
		name    string
		changes []engine.Change
		closed  []mt
		keys    []string // ClosedBy of the first closed pair
	}{
		{name: "nothing invalid"},
		{name: "a broken policy closes its mesh and type",
			changes: []engine.Change{broken("default/policies/TrafficPermission/deny-all")},
			closed:  []mt{{"default", "TrafficPermission"}}, keys: []string{"default/policies/TrafficPermission/deny-all"}},
		{name: "a broken policy of a type with no other policy closes that type",
			changes: []engine.Change{broken("default/policies/TrafficLog/x")},
			closed:  []mt{{"default", "TrafficLog"}}, keys: []string{"default/policies/TrafficLog/x"}},
		{name: "a broken scope closes every type of its mesh",
			changes: []engine.Change{broken("default/scopes/Apps")},
			closed:  []mt{{"default", "TrafficPermission"}, {"default", "TrafficLog"}}, keys: []string{"default/scopes/Apps"}},
		{name: "a broken mesh closes every type of its mesh",
			changes: []engine.Change{broken("other/mesh")},
			closed:  []mt{{"other", "TrafficPermission"}}, keys: []string{"other/mesh"}},
		{name: "a policy naming a scope that does not exist (a raced delete) closes its type",
			changes: puts(mustYAML(t, `{kind: Policy, name: deny, scope: Gone, rank: Absolute, action: DENY, sources: [{}], destinations: [{}]}`)),
			closed:  []mt{{"default", "TrafficPermission"}}, keys: []string{"default/policies/TrafficPermission/deny"}},
		{name: "a scope under a missing parent closes its mesh",
			changes: puts(mustYAML(t, `{kind: Scope, name: "Apps:HR", parent: Apps, selectors: [{match: {dept: hr}}]}`)),
			closed:  []mt{{"default", "TrafficPermission"}, {"default", "TrafficLog"}}, keys: []string{"default/scopes/Apps:HR"}},
		{name: "a key that is no key but names a mesh closes that mesh",
			changes: []engine.Change{broken("default/garbage")},
			closed:  []mt{{"default", "TrafficPermission"}, {"default", "TrafficLog"}}, keys: []string{"default/garbage"}},
		{name: "a policy key with a bad name closes its type",
			changes: []engine.Change{broken("default/policies/TrafficLog/bad name")},
			closed:  []mt{{"default", "TrafficLog"}}, keys: []string{"default/policies/TrafficLog/bad name"}},
		{name: "a key whose mesh cannot be read harms no mesh",
			changes: []engine.Change{broken("\xff\xfe/mesh"), broken("bad mesh/policies/TrafficPermission/x"), broken("")}},
		{name: "a broken workload closes nothing",
			changes: []engine.Change{broken("default/workloads/w")}},
		{name: "invalidResources: Skip leaves the invalid policy out",
			changes: append(puts(mustYAML(t, `{kind: Mesh, name: default, invalidResources: Skip}`)),
				broken("default/policies/TrafficPermission/deny-all"), broken("default/scopes/Apps"))},
		{name: "a broken mesh cannot choose Skip for itself",
			changes: append(puts(mustYAML(t, `{kind: Mesh, name: other, invalidResources: Skip}`)), broken("other/mesh")),
			closed:  []mt{{"other", "TrafficPermission"}}, keys: []string{"other/mesh"}},
		{name: "a mesh holding nothing but a broken policy is closed, not absent",
			changes: []engine.Change{broken("third/policies/TrafficPermission/x")},
			closed:  []mt{{"third", "TrafficPermission"}}, keys: []string{"third/policies/TrafficPermission/x"}},
	}
	flow := func(m mt) *engine.Request {
		return &engine.Request{Mesh: m.mesh, Type: m.typ, Source: resource.Tags{"svc": "web"}, Destination: resource.Tags{"svc": "backend"}}
	}
	base := engine.Build(1, mustYAML(t, invalidWorld))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base.Apply(2, tc.changes)
			isClosed := map[mt]bool{}
			for _, m := range tc.closed {
				isClosed[m] = true
			}
			for _, m := range append(append([]mt(nil), all...), mt{"third", "TrafficPermission"}) {
				for _, explain := range []bool{false, true} {
					req := flow(m)
					req.Explain = explain
					d, err := s.Decide(req)
					switch {
					case isClosed[m]:
						if err != nil {
							t.Fatalf("%v: Decide: %v", m, err)
						}
						if d.Action != resource.Deny || d.Outbound.Action != resource.Deny || d.Inbound.Action != resource.Deny ||
							d.Outbound.Reason != engine.ReasonInvalidResource || d.Inbound.Reason != engine.ReasonInvalidResource {
							t.Errorf("%v explain=%v: %+v, want DENY on both sides with INVALID_RESOURCE", m, explain, d)
						}
						if explain && (d.Explain == nil || d.Explain.Inbound.Reason != engine.ReasonInvalidResource) {
							t.Errorf("%v: explain %+v", m, d.Explain)
						}
					case m.mesh == "third":
						if !errors.Is(err, engine.ErrMeshNotFound) {
							t.Errorf("%v: %+v, %v; want ErrMeshNotFound", m, d, err)
						}
					default:
						if err != nil || d.Action != resource.Allow || d.Inbound.Reason != engine.ReasonMatched {
							t.Errorf("%v: %+v, %v; want ALLOW as before", m, d, err)
						}
					}
				}
				rs, rerr := s.RulesFor(m.mesh, m.typ, resource.Tags{"svc": "backend"})
				_, serr := s.Resolve(&engine.ResolveRequest{Mesh: m.mesh, Type: m.typ,
					Source: resource.Tags{"svc": "web"}, Destination: resource.Tags{"svc": "backend"}})
				if isClosed[m] {
					deny := engine.SideRules{Fallback: resource.Deny, FallbackReason: engine.ReasonInvalidResource}
					if rerr != nil || len(rs.Inbound.Rules)+len(rs.Outbound.Rules) != 0 ||
						rs.Inbound.Fallback != deny.Fallback || rs.Inbound.FallbackReason != deny.FallbackReason ||
						rs.Outbound.Fallback != deny.Fallback || rs.Outbound.FallbackReason != deny.FallbackReason {
						t.Errorf("%v: RulesFor %+v, %v; want deny-all", m, rs, rerr)
					}
					if !errors.Is(serr, engine.ErrInvalidStored) {
						t.Errorf("%v: Resolve: %v, want ErrInvalidStored", m, serr)
					}
				} else if m.mesh != "third" {
					if rerr != nil || len(rs.Inbound.Rules) == 0 {
						t.Errorf("%v: RulesFor %+v, %v; want the rules as before", m, rs, rerr)
					}
					if serr != nil {
						t.Errorf("%v: Resolve: %v", m, serr)
					}
				}
			}
			if len(tc.closed) > 0 {
				got := s.ClosedBy(tc.closed[0].mesh, tc.closed[0].typ)
				if fmt.Sprint(got) != fmt.Sprint(tc.keys) {
					t.Errorf("ClosedBy = %q, want %q", got, tc.keys)
				}
			}
			// Deleting or repairing what was invalid opens the mesh again.
			var undo []engine.Change
			for _, c := range tc.changes {
				if c.Key.Kind == resource.KindMesh && c.Err == nil {
					continue
				}
				undo = append(undo, engine.Change{Path: c.Path, Key: c.Key})
			}
			fixed := s.Apply(3, undo)
			for _, m := range all {
				if got := fixed.ClosedBy(m.mesh, m.typ); got != nil {
					t.Errorf("after the fix, %v is still closed by %q", m, got)
				}
				if d, err := fixed.Decide(flow(m)); err != nil || d.Action != resource.Allow {
					t.Errorf("after the fix, %v: %+v, %v", m, d, err)
				}
			}
		})
	}
}

// TestInvalidResourcesSetting checks the Mesh field's decoding and encoding.
func TestInvalidResourcesSetting(t *testing.T) {
	for _, v := range []string{"Deny", "Skip"} {
		rs := mustYAML(t, "{kind: Mesh, name: m, invalidResources: "+v+"}")
		if got := rs[0].(*resource.Mesh).InvalidResources.String(); got != v {
			t.Errorf("%s decoded as %s", v, got)
		}
		b, err := resource.EncodeJSON(rs[0])
		if err != nil {
			t.Fatal(err)
		}
		back, err := resource.DecodeJSON(b)
		if err != nil || back.(*resource.Mesh).InvalidResources.String() != v {
			t.Errorf("%s: round trip %s: %v", v, b, err)
		}
	}
	if _, err := resource.DecodeYAML([]byte("{kind: Mesh, name: m, invalidResources: Allow}")); !errors.Is(err, resource.ErrInvalid) {
		t.Errorf("invalidResources: Allow: %v, want ErrInvalid", err)
	}
}

// TestDotNamesRefused: "." and ".." are path steps, not names (issue 12,
// minor): refused as a resource's name, a type, a scope reference and in a key.
func TestDotNamesRefused(t *testing.T) {
	for _, doc := range []string{
		`{kind: Policy, name: ".", sources: [{}], destinations: [{}]}`,
		`{kind: Policy, name: "..", sources: [{}], destinations: [{}]}`,
		`{kind: Policy, name: p, type: "..", sources: [{}], destinations: [{}]}`,
		`{kind: Scope, name: "..", selectors: [{}]}`,
		`{kind: Mesh, name: "."}`,
		`{kind: Policy, name: p, mesh: "..", sources: [{}], destinations: [{}]}`,
	} {
		if _, err := resource.DecodeYAML([]byte(doc)); !errors.Is(err, resource.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", doc, err)
		}
	}
	for _, path := range []string{"../mesh", "default/scopes/.", "default/policies/../x"} {
		if _, err := resource.ParseKey(path); err == nil {
			t.Errorf("ParseKey(%q) accepted", path)
		}
	}
	if _, err := resource.DecodeYAML([]byte(`{kind: Policy, name: "a.b..c", sources: [{}], destinations: [{}]}`)); err != nil {
		t.Errorf("a name with dots: %v", err)
	}
}

package engine

// Stored resources that do not validate fail closed (docs/storage.md, "Invalid
// stored values"): unless its Mesh sets invalidResources: Skip, a mesh with an
// invalid Policy answers every Decide of that policy's type DENY on both sides
// (reason INVALID_RESOURCE), WatchRules deny-all and Resolve ErrInvalidStored;
// an invalid Scope or Mesh does so for every type of its mesh. "Invalid" is a
// broken value (it does not decode or validate, or its key is not a key) and a
// valid resource in conflict with the others (a scope on a cycle or under a
// missing parent, a policy naming a missing scope, forms mixed in one type).
// A broken key whose mesh cannot be read harms no mesh.

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/verdictpdp/verdict/engine/resource"
)

// ErrInvalidStored is returned by Resolve for a mesh and type that an invalid
// stored resource closes (docs/storage.md); the error names the keys.
var ErrInvalidStored = errors.New("invalid stored resource")

// taint is what broken values close in one mesh: the paths that close every
// type, and per type the paths that close it.
type taint struct {
	mesh  []string
	types map[string][]string
}

// brokenTaints maps broken values to the meshes and types they close; nil when
// none does.
func brokenTaints(broken func(func(path string, b *InvalidResource) bool)) map[string]*taint {
	var out map[string]*taint
	broken(func(path string, b *InvalidResource) bool {
		mesh, typ, ok := b.scopeOfHarm()
		if !ok {
			return true
		}
		if out == nil {
			out = map[string]*taint{}
		}
		t := out[mesh]
		if t == nil {
			t = &taint{}
			out[mesh] = t
		}
		if typ == "" {
			t.mesh = append(t.mesh, path)
		} else {
			if t.types == nil {
				t.types = map[string][]string{}
			}
			t.types[typ] = append(t.types[typ], path)
		}
		return true
	})
	return out
}

// scopeOfHarm returns the mesh a broken value closes and, when it closes only
// one type, the type; ok is false when it closes nothing (its mesh cannot be
// read, or it is a kind that closes nothing, such as a workload).
func (b *InvalidResource) scopeOfHarm() (mesh, typ string, ok bool) {
	switch b.Key.Kind {
	case resource.KindMesh, resource.KindScope:
		return b.Key.Mesh, "", true
	case resource.KindPolicy:
		return b.Key.Mesh, b.Key.Type, true
	case 0:
	default:
		return "", "", false
	}
	// The path is not a key: read what can be read of its stored bytes.
	parts := strings.Split(b.Path, "/")
	if !utf8.ValidString(parts[0]) || resource.CheckName(parts[0]) != nil {
		return "", "", false
	}
	mesh = parts[0]
	if len(parts) > 1 && parts[1] == "workloads" {
		return "", "", false
	}
	if len(parts) > 2 && parts[1] == "policies" && utf8.ValidString(parts[2]) && resource.CheckName(parts[2]) == nil {
		return mesh, parts[2], true
	}
	return mesh, "", true
}

// RenderPath is how a stored key (without the store's prefix) is shown in
// every answer, error and log line: the key itself when it is valid UTF-8 and
// does not start with a quote, else the key Go-quoted ("\xff\xfe/mesh",
// quotes included). It fits a protobuf string and is one-to-one: a rendering
// that starts with a quote is always a quoted key, so a key written to look
// like another's rendering (`"\xff\xfe/mesh"` literally) is shown quoted
// again, never as the other. Changes, InvalidResource.Path and the digest
// keep the stored bytes themselves; only what is shown is rendered.
func RenderPath(raw string) string {
	if utf8.ValidString(raw) && !strings.HasPrefix(raw, `"`) {
		return raw
	}
	return strconv.Quote(raw)
}

// closedBy returns the invalid keys that close mesh and type in s, or nil. ms
// is the mesh (nil when it holds no decodable resource) and ts the type (nil
// when it holds no policy).
func (s *Snapshot) closedBy(mesh string, ms *meshState, ts *typeState) []string {
	if ms.skipsInvalid() {
		return nil
	}
	var paths []string
	if t := s.taints[mesh]; t != nil {
		paths = append(paths, t.mesh...)
		if ts != nil {
			paths = append(paths, t.types[ts.name]...)
		}
	}
	if ms != nil {
		for name := range ms.scopes.invalid {
			paths = append(paths, resource.Key{Kind: resource.KindScope, Mesh: mesh, Name: name}.String())
		}
		if ts != nil && ts.invalid > 0 {
			ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
				if cp.err != "" {
					paths = append(paths, cp.p.Key().String())
				}
				return true
			})
		}
	}
	sort.Strings(paths)
	return paths
}

// closedByType is closedBy for a type given by name.
func (s *Snapshot) closedByType(mesh string, ms *meshState, typ string) []string {
	if s.taints == nil && (ms == nil || len(ms.scopes.invalid) == 0 && ms.invalid == 0) {
		return nil // the common case, without a lookup
	}
	var ts *typeState
	if ms != nil {
		ts, _ = ms.types.Get(typ)
	}
	if ts == nil {
		// A type with no decoded policy can still be closed by a broken one.
		if t := s.taints[mesh]; t != nil && len(t.types[typ]) > 0 && !ms.skipsInvalid() {
			paths := append(append([]string(nil), t.mesh...), t.types[typ]...)
			sort.Strings(paths)
			return paths
		}
	}
	return s.closedBy(mesh, ms, ts)
}

// skipsInvalid reports whether the mesh's Mesh sets invalidResources: Skip.
func (ms *meshState) skipsInvalid() bool {
	return ms != nil && ms.doc != nil && ms.doc.InvalidResources == resource.InvalidSkip
}

// closedDecision is the answer for a flow of a closed mesh and type.
func closedDecision(revision int64, explain bool) Decision {
	side := SideDecision{Action: resource.Deny, Reason: ReasonInvalidResource}
	d := Decision{Action: resource.Deny, Outbound: side, Inbound: side, Revision: revision}
	if explain {
		d.Explain = &Explanation{Outbound: SideTrace{Reason: ReasonInvalidResource}, Inbound: SideTrace{Reason: ReasonInvalidResource}}
	}
	return d
}

// closedRules is the rule set of a workload of a closed mesh and type: no rule,
// DENY whatever the flow.
func closedRules(set typeSettings) RuleSet {
	side := SideRules{Fallback: resource.Deny, FallbackReason: ReasonInvalidResource, Combine: set.combine}
	return RuleSet{Inbound: side, Outbound: side}
}

// closedError is Resolve's error for a closed mesh and type.
func closedError(mesh, typ string, paths []string) error {
	const show = 5
	shown := make([]string, 0, show)
	for _, p := range paths[:min(len(paths), show)] {
		shown = append(shown, RenderPath(p))
	}
	list := strings.Join(shown, ", ")
	if len(paths) > show {
		list += fmt.Sprintf(" and %d more", len(paths)-show)
	}
	return fmt.Errorf("%w: mesh %q type %s is closed by invalid stored resources (%s); fix or delete them, or set invalidResources: Skip on the mesh", ErrInvalidStored, mesh, typ, list)
}

// ClosedBy returns the keys (paths without prefix, as stored: RenderPath
// shows them) of the invalid stored resources that make Decide of mesh and type answer DENY with reason
// INVALID_RESOURCE; nil when the mesh and type decide normally.
func (s *Snapshot) ClosedBy(mesh, typ string) []string {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, _ := s.meshes.Get(mesh)
	return s.closedByType(mesh, ms, typ)
}

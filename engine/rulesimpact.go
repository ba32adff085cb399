package engine

import (
	"slices"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// RulesImpact tells which workloads' rule lists (RulesFor) a change set may
// have altered, so that a follower of many workloads (WatchRules) computes
// again only those: a change of a policy can alter only the lists of the
// workloads that one of its rules, before or after the change, selects on
// its own end (the source for outbound, the destination for inbound);
// anything else recomputes more. It may answer true for a list that did not
// change, never false for one that did.
type RulesImpact struct {
	all    bool
	meshes map[string]*meshImpact
}

type meshImpact struct {
	all   bool
	types map[string]*typeImpact
}

type typeImpact struct {
	all bool
	// rules are the rules and targetRef attachments of the changed policies,
	// as they were and as they are.
	rules []*index.Rule
}

// RulesImpact returns what the changes that made s from prev may have altered
// in RulesFor. With prev nil, everything. Per kind of change:
//   - a workload: no rule list (RulesFor takes tags; how a watched workload
//     resolves to tags is the follower's to check);
//   - a Mesh, a Scope, or a broken value whose key is not a key: every list
//     of the mesh (of every mesh);
//   - a policy: in its mesh and type, the lists of the workloads its rules
//     select, before or after; every list of the type when the type's
//     standing for all workloads changed with it (known or not, closed by an
//     invalid resource or not, a side applicable or not, some rule a
//     candidate in a scope or not), or when the type holds an invalid or
//     conflicting policy (the change may make another one valid).
func (s *Snapshot) RulesImpact(prev *Snapshot, changes []Change) *RulesImpact {
	ri := &RulesImpact{meshes: map[string]*meshImpact{}}
	if prev == nil {
		ri.all = true
		return ri
	}
	type meshType struct{ mesh, typ string }
	var order []meshType
	names := map[meshType][]string{}
	for _, c := range changes {
		switch c.Key.Kind {
		case resource.KindWorkload:
		case resource.KindPolicy:
			k := meshType{c.Key.Mesh, c.Key.Type}
			if _, ok := names[k]; !ok {
				order = append(order, k)
			}
			names[k] = append(names[k], c.Key.Name)
		case resource.KindMesh, resource.KindScope:
			ri.mesh(c.Key.Mesh).all = true
		default:
			ri.all = true
			return ri
		}
	}
	for _, k := range order {
		mi := ri.mesh(k.mesh)
		if mi.all {
			continue
		}
		pm, _ := prev.meshes.Get(k.mesh)
		nm, _ := s.meshes.Get(k.mesh)
		if pm == nil || nm == nil || pm.scopes != nm.scopes || pm.doc != nm.doc {
			mi.all = true
			continue
		}
		ti := mi.types[k.typ]
		if ti == nil {
			ti = &typeImpact{}
			mi.types[k.typ] = ti
		}
		before, after := prev.standing(pm, k.mesh, k.typ), s.standing(nm, k.mesh, k.typ)
		switch {
		case before.closed && after.closed:
			continue // deny-all before and after, whatever the policies
		case !before.equal(after) || before.fragile || after.fragile:
			ti.all = true
			continue
		}
		for _, name := range names[k] {
			ti.rules = appendPolicyRules(ti.rules, pm, k.typ, name)
			ti.rules = appendPolicyRules(ti.rules, nm, k.typ, name)
		}
	}
	return ri
}

func (ri *RulesImpact) mesh(name string) *meshImpact {
	mi := ri.meshes[name]
	if mi == nil {
		mi = &meshImpact{types: map[string]*typeImpact{}}
		ri.meshes[name] = mi
	}
	return mi
}

// May reports whether RulesFor(mesh, typ, workload) may differ between the
// two snapshots.
func (ri *RulesImpact) May(mesh, typ string, workload resource.Tags) bool {
	if ri.all {
		return true
	}
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	mi := ri.meshes[mesh]
	if mi == nil {
		return false
	}
	if mi.all {
		return true
	}
	ti := mi.types[typ]
	if ti == nil {
		return false
	}
	if ti.all {
		return true
	}
	for _, r := range ti.rules {
		for side, own := range [2]*index.Matcher{r.Src, r.Dst} {
			if r.Sides&index.SideBits[side] != 0 && (own == nil || own.Matches(workload)) {
				return true
			}
		}
	}
	return false
}

// appendPolicyRules appends the rules and attachments of a policy of ms.
func appendPolicyRules(out []*index.Rule, ms *meshState, typ, name string) []*index.Rule {
	ts, ok := ms.types.Get(typ)
	if !ok {
		return out
	}
	cp, ok := ts.policies.Get(name)
	if !ok {
		return out
	}
	return append(append(out, cp.rules...), cp.attach...)
}

// typeStanding is what RulesFor reads of a mesh and type alike for every
// workload (rules.go): a change of any of it may alter every list.
type typeStanding struct {
	closed, unknown bool
	policies        bool    // some valid enforced policy
	notApplicable   [2]bool // per side
	// candidates: per scope ord (0: the mesh root), whether the scope has an
	// enforced S&D rule (hasCandidate's scopeRules).
	candidates []bool
	// fragile: some policy is invalid in its mesh, or forms conflict: a change
	// of one policy may make another valid or invalid.
	fragile bool
}

func (s *Snapshot) standing(ms *meshState, mesh, typ string) typeStanding {
	var st typeStanding
	st.closed = s.closedByType(mesh, ms, typ) != nil
	st.unknown = ms.checkType(typ) != nil
	ts, ok := ms.types.Get(typ)
	if !ok {
		return st
	}
	st.policies = ts.viewCounts(false).policies > 0
	st.notApplicable = [2]bool{ts.notApplicable(0, false), ts.notApplicable(1, false)}
	st.candidates = make([]bool, len(ts.scopeRules))
	for i, n := range ts.scopeRules {
		st.candidates[i] = n > 0
	}
	st.fragile = ts.invalid > 0 || ts.conflicted
	return st
}

func (a typeStanding) equal(b typeStanding) bool {
	return a.closed == b.closed && a.unknown == b.unknown && a.policies == b.policies &&
		a.notApplicable == b.notApplicable && slices.Equal(a.candidates, b.candidates) && a.fragile == b.fragile
}

package engine

// Lint's findings about policies and scopes as a whole (docs/lint.md): dead
// policies, overlapping sibling scopes, audit policies that never change an
// answer.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
)

// memberOf reports whether tags are a member of the scope at ord: its own
// selectors match, and every ancestor's.
func (ms *meshState) memberOf(ord int32, tags resource.Tags) bool {
	if ord == 0 {
		return true
	}
	si := ms.scopes.list[ord-1]
	for _, s := range append([]int32{ord}, si.ancestors...) {
		ok := false
		for _, m := range ms.scopes.list[s-1].selectors {
			if m.Matches(tags) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// lintScopes adds the overlapping sibling scopes of a mesh: two scopes of
// one parent (or both at the top) that one tag set is a member of.
func (s *Snapshot) lintScopes(ms *meshState, ans *LintAnswer) {
	list := ms.scopes.list
	if len(list) < 2 {
		return
	}
	lp := &lintPart{s: s, ms: ms, sp: newSpace(ms, nil), budget: defaultLintBudget}
	member := make([]*pred, len(list)+1)
	for _, si := range list {
		var terms []*pred
		for i := range si.doc.Selectors {
			if c, ok := lp.sp.selectorConj(&si.doc.Selectors[i], 0); ok {
				terms = append(terms, conjPred(c))
			}
		}
		member[si.ord] = orPred(terms...)
	}
	workloads := workloadsOf(ms)
	for i, a := range list {
		for _, b := range list[i+1:] {
			if a.parent != b.parent {
				continue
			}
			lp.steps = 0
			bx, r := lp.search(lp.sp.fullBox(), []*pred{member[a.ord], member[b.ord]}, nil, nil, nil)
			if r != resFound {
				continue
			}
			tags, _, _, _ := lp.sp.point(bx)
			first, second := a, b
			if second.doc.Name < first.doc.Name {
				first, second = second, first
			}
			w := &Witness{Source: tags}
			for _, e := range workloads {
				if ms.memberOf(a.ord, e.Workload.Tags) && ms.memberOf(b.ord, e.Workload.Tags) {
					w.Workloads = append(w.Workloads, e.Workload.Name)
				}
			}
			where := "at the top"
			if a.parent != 0 {
				where = "under " + list[a.parent-1].doc.Name
			}
			msg := fmt.Sprintf("sibling scopes (%s) overlap: a workload with the witness's tags is a member of both", where)
			if n := len(w.Workloads); n > 0 {
				msg += fmt.Sprintf("; %d workload(s) of the inventory are", n)
			}
			ans.Findings = append(ans.Findings, Finding{Kind: FindingOverlappingScopes, Severity: FindingOverlappingScopes.Severity(),
				Mesh: ms.name, Scope: first.doc.Name, Related: []RuleRef{{Scope: second.doc.Name}}, Message: msg, Witness: w})
		}
	}
}

// endTags are the distinct tag sets the inventory's workloads present as a
// source (their own) and as a destination (their own, and with each port's
// tags).
func endTags(ms *meshState) (src, dst []resource.Tags) {
	seen := [2]map[string]bool{{}, {}}
	add := func(end int, t resource.Tags) {
		k := tagsText(t)
		if seen[end][k] {
			return
		}
		seen[end][k] = true
		if end == 0 {
			src = append(src, t)
		} else {
			dst = append(dst, t)
		}
	}
	for _, e := range workloadsOf(ms) {
		add(0, e.Workload.Tags)
		add(1, e.Workload.Tags)
		for _, p := range e.Workload.Ports {
			add(1, peerTags(e, true, p.Port))
		}
	}
	return src, dst
}

func tagsText(t resource.Tags) string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(t[k])
		b.WriteByte(0)
	}
	return b.String()
}

// lintDead adds the policies of a partition that select no workload of the
// inventory: on no side is a workload both matched by a rule's end there
// and a member of the rule's scope (only in a mesh that has workloads).
func (s *Snapshot) lintDead(ms *meshState, ts *typeState, ans *LintAnswer) {
	src, dst := endTags(ms)
	if len(src) == 0 {
		return
	}
	var names []string
	ts.policies.Range(func(name string, cp *compiledPolicy) bool {
		if cp.err != "" {
			return true
		}
		for _, r := range cp.rules {
			for side, tags := range [2][]resource.Tags{src, dst} {
				if r.Sides&sideBit(side) == 0 {
					continue
				}
				m := r.Src
				if side == 1 {
					m = r.Dst
				}
				for _, t := range tags {
					if matcherHolds(m, t) && ms.memberOf(r.Scope, t) {
						return true
					}
				}
			}
		}
		names = append(names, name)
		return true
	})
	slices.Sort(names)
	for _, name := range names {
		cp, _ := ts.policies.Get(name)
		ans.Findings = append(ans.Findings, Finding{Kind: FindingDead, Severity: FindingDead.Severity(), Mesh: ms.name, Type: ts.name,
			Policy: name, Scope: cp.p.Scope,
			Message: fmt.Sprintf("selects no workload: none of the mesh's %d workloads is matched by a rule's end on a side where it is a candidate (%d tag sets checked as a source, %d as a destination)",
				len(workloadsOf(ms)), len(src), len(dst))})
	}
}

// sideBit is the mask bit of a side.
func sideBit(side int) uint8 {
	if side == 0 {
		return 1
	}
	return 2
}

// auditPairs bounds the decisions of the audit check.
const auditPairs = 250_000

// lintAudit adds the audit policies of a partition whose shadow answer
// never differs from the enforced one on the inventory's workload pairs,
// on every class of flows (observed flows are not kept yet).
func (s *Snapshot) lintAudit(ms *meshState, ts *typeState, typ string, ans *LintAnswer) {
	var audit []string
	ts.policies.Range(func(name string, cp *compiledPolicy) bool {
		if cp.err == "" && cp.audit() {
			audit = append(audit, name)
		}
		return true
	})
	if len(audit) == 0 {
		return
	}
	where := ms.name + "/" + typ
	ws := workloadsOf(ms)
	if len(ws) == 0 {
		ans.Notes = append(ans.Notes, where+": audit policies not checked: the mesh has no workload (the check runs on the inventory's pairs)")
		return
	}
	b, err := s.Bulk(ms.name, typ)
	if err != nil {
		return
	}
	classes := FlowClasses(ms.name, typ, s)
	if len(ws)*len(ws)*len(classes) > auditPairs {
		ans.Notes = append(ans.Notes, fmt.Sprintf("%s: audit policies not checked: %d workloads on %d classes of flows is over %d decisions",
			where, len(ws), len(classes), auditPairs))
		return
	}
	differs := map[string]bool{}
	srcClass := make([]ClassID, len(ws))
	for i, w := range ws {
		srcClass[i] = b.Intern(peerTags(w, false, 0))
	}
	for _, c := range classes {
		dstSeen := map[ClassID]bool{}
		for _, w := range ws {
			dc := b.Intern(peerTags(w, true, c.Port))
			if dstSeen[dc] {
				continue
			}
			dstSeen[dc] = true
			for _, sc := range srcClass {
				if d := b.Decide(sc, dc, c.Protocol, c.Port); d.Audit != nil {
					differs[d.Audit.Policy] = true
				}
			}
		}
	}
	for _, name := range audit {
		if differs[name] {
			continue
		}
		cp, _ := ts.policies.Get(name)
		ans.Findings = append(ans.Findings, Finding{Kind: FindingAuditNeverDiffers, Severity: FindingAuditNeverDiffers.Severity(),
			Mesh: ms.name, Type: typ, Policy: name, Scope: cp.p.Scope,
			Message: fmt.Sprintf("its shadow answer never differs from the enforced one on the inventory's %d workload pairs, on %d classes of flows (observed flows are not kept yet)",
				len(ws)*len(ws), len(classes))})
	}
}

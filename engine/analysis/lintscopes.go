package analysis

// Lint's findings about policies and scopes as a whole (docs/lint.md): dead
// policies, overlapping sibling scopes, audit policies that never change an
// answer.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// lintScopes adds the overlapping sibling scopes of a mesh: two scopes of
// one parent (or both at the top) that one tag set is a member of.
func lintScopes(p *engine.Partition, ans *LintAnswer) {
	list := p.Scopes()
	if len(list) < 2 {
		return
	}
	lp := &lintPart{p: p, sp: newSpace(p, false), budget: defaultLintBudget}
	member := make([]*pred, len(list)+1)
	for _, si := range list {
		var terms []*pred
		for i := range si.Doc.Selectors {
			if c, ok := lp.sp.selectorConj(&si.Doc.Selectors[i], 0); ok {
				terms = append(terms, conjPred(c))
			}
		}
		member[si.Ord] = orPred(terms...)
	}
	workloads := workloadsOf(p.Inventory())
	for i, a := range list {
		for _, b := range list[i+1:] {
			if a.Parent != b.Parent {
				continue
			}
			lp.steps = 0
			bx, r := lp.search(lp.sp.fullBox(), []*pred{member[a.Ord], member[b.Ord]}, nil, nil, nil)
			if r != resFound {
				continue
			}
			tags, _, _, _ := lp.sp.point(bx)
			first, second := a, b
			if second.Doc.Name < first.Doc.Name {
				first, second = second, first
			}
			w := &Witness{Source: tags}
			for _, e := range workloads {
				if p.MemberOf(a.Ord, e.Workload.Tags) && p.MemberOf(b.Ord, e.Workload.Tags) {
					w.Workloads = append(w.Workloads, e.Workload.Name)
				}
			}
			where := "at the top"
			if a.Parent != 0 {
				where = "under " + list[a.Parent-1].Doc.Name
			}
			msg := fmt.Sprintf("sibling scopes (%s) overlap: a workload with the witness's tags is a member of both", where)
			if n := len(w.Workloads); n > 0 {
				msg += fmt.Sprintf("; %d workload(s) of the inventory are", n)
			}
			ans.Findings = append(ans.Findings, Finding{Kind: FindingOverlappingScopes, Severity: FindingOverlappingScopes.Severity(),
				Mesh: p.Mesh(), Scope: first.Doc.Name, Related: []RuleRef{{Scope: second.Doc.Name}}, Message: msg, Witness: w})
		}
	}
}

// endTags are the distinct tag sets the inventory's workloads present as a
// source (their own) and as a destination (their own, and with each port's
// tags).
func endTags(inv *inventory.Inventory) (src, dst []resource.Tags) {
	seen := [2]map[string]bool{{}, {}}
	add := func(end int, t resource.Tags) {
		k := resource.TagsKey(t)
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
	for _, e := range workloadsOf(inv) {
		add(0, e.Workload.Tags)
		add(1, e.Workload.Tags)
		for _, p := range e.Workload.Ports {
			add(1, peerTags(e, true, p.Port))
		}
	}
	return src, dst
}

// lintDead adds the policies of a partition that select no workload of the
// inventory: on no side is a workload both matched by a rule's end there
// and a member of the rule's scope (only in a mesh that has workloads).
func lintDead(p *engine.Partition, ans *LintAnswer) {
	inv := p.Inventory()
	src, dst := endTags(inv)
	if len(src) == 0 {
		return
	}
	var dead []*resource.Policy
	for pv := range p.Policies() {
		if pv.Err == "" && !selectsSome(p, pv, src, dst) {
			dead = append(dead, pv.Doc)
		}
	}
	slices.SortFunc(dead, func(a, b *resource.Policy) int { return strings.Compare(a.Name, b.Name) })
	for _, pol := range dead {
		ans.Findings = append(ans.Findings, Finding{Kind: FindingDead, Severity: FindingDead.Severity(), Mesh: p.Mesh(), Type: p.Type(),
			Policy: pol.Name, Scope: pol.Scope,
			Message: fmt.Sprintf("selects no workload: none of the mesh's %d workloads is matched by a rule's end on a side where it is a candidate (%d tag sets checked as a source, %d as a destination)",
				len(workloadsOf(inv)), len(src), len(dst))})
	}
}

// selectsSome reports whether a rule of a valid policy has, on a side where
// it is a candidate, one of the tag sets (src as a source, dst as a
// destination) matched by its end there and a member of its scope.
func selectsSome(p *engine.Partition, pv engine.PolicyView, src, dst []resource.Tags) bool {
	for _, r := range pv.Rules {
		for side, tags := range [2][]resource.Tags{src, dst} {
			if r.Sides&sideBit(side) == 0 {
				continue
			}
			m := r.Src
			if side == 1 {
				m = r.Dst
			}
			for _, t := range tags {
				if matcherHolds(m, t) && p.MemberOf(r.Scope, t) {
					return true
				}
			}
		}
	}
	return false
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
func lintAudit(p *engine.Partition, ans *LintAnswer) {
	var audit []*resource.Policy
	for pv := range p.Policies() {
		if pv.Err == "" && pv.Audit {
			audit = append(audit, pv.Doc)
		}
	}
	if len(audit) == 0 {
		return
	}
	slices.SortFunc(audit, func(a, b *resource.Policy) int { return strings.Compare(a.Name, b.Name) })
	where := p.Mesh() + "/" + p.Type()
	ws := workloadsOf(p.Inventory())
	if len(ws) == 0 {
		ans.Notes = append(ans.Notes, where+": audit policies not checked: the mesh has no workload (the check runs on the inventory's pairs)")
		return
	}
	b, err := NewBulk(p.Snapshot(), p.Mesh(), p.Type())
	if err != nil {
		return
	}
	classes := FlowClasses(p.Mesh(), p.Type(), p.Snapshot())
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
	for _, pol := range audit {
		if differs[pol.Name] {
			continue
		}
		ans.Findings = append(ans.Findings, Finding{Kind: FindingAuditNeverDiffers, Severity: FindingAuditNeverDiffers.Severity(),
			Mesh: p.Mesh(), Type: p.Type(), Policy: pol.Name, Scope: pol.Scope,
			Message: fmt.Sprintf("its shadow answer never differs from the enforced one on the inventory's %d workload pairs, on %d classes of flows (observed flows are not kept yet)",
				len(ws)*len(ws), len(classes))})
	}
}

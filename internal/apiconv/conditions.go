package apiconv

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// SetConditions writes a policy's standing conditions on sr: their names in
// order and a message per name (docs/lint.md, "Standing conditions").
func SetConditions(sr *verdictv1.StoredResource, cs []conditions.Condition) {
	if len(cs) == 0 {
		return
	}
	sr.Conditions = make([]string, len(cs))
	sr.ConditionMessages = make(map[string]string, len(cs))
	for i, c := range cs {
		sr.Conditions[i] = c.Kind.String()
		sr.ConditionMessages[c.Kind.String()] = c.Message
	}
}

// PolicyConditions writes on sr the conditions of r in snap when r is a
// policy, as tr judges them; nothing for other kinds or a nil tracker.
func PolicyConditions(tr *conditions.Tracker, snap *engine.Snapshot, sr *verdictv1.StoredResource, r resource.Resource) {
	p, ok := r.(*resource.Policy)
	if !ok || tr == nil || sr == nil {
		return
	}
	if cs, ok := tr.Policy(snap, p.Mesh, p.Type, p.Name); ok {
		SetConditions(sr, cs)
	}
}

// ConditionCounts are the counts of the policies of snap per mesh and
// condition, as tr judges them.
func ConditionCounts(tr *conditions.Tracker, snap *engine.Snapshot) []*verdictv1.ConditionCount {
	counts := tr.Counts(snap)
	out := make([]*verdictv1.ConditionCount, len(counts))
	for i, c := range counts {
		out[i] = &verdictv1.ConditionCount{Mesh: c.Mesh, Condition: c.Kind.String(), Policies: int64(c.Policies)}
	}
	return out
}

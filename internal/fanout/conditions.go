package fanout

// The standing conditions on WatchResources (docs/lint.md, "Standing
// conditions"): each policy a message shows carries its conditions at the
// message's revision, and a change set also lists, as conditions_only
// changes, the other policies whose conditions it moved.

import (
	"sort"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// fillConditions writes the conditions of the policy a change puts, as it
// is in snap.
func (f *Feed) fillConditions(snap *engine.Snapshot, c engine.Change, rc *verdictv1.ResourceChange) {
	if f.conds != nil && c.Resource != nil {
		apiconv.PolicyConditions(f.conds, snap, rc.GetResource(), c.Resource)
	}
}

// movedConditions lists the policies not in cs whose conditions moved from
// prev to snap, as conditions_only changes: the partitions cs touched (a
// policy's own; every type of a mesh whose mesh, scopes or workloads
// changed) are judged on both sides and compared.
func (f *Feed) movedConditions(prev, snap *engine.Snapshot, cs []engine.Change) []*verdictv1.ResourceChange {
	if f.conds == nil || prev == nil {
		return nil
	}
	touched := map[[2]string]bool{}
	written := map[string]bool{}
	for _, c := range cs {
		k := c.Key
		if c.Resource != nil {
			k = c.Resource.Key()
		}
		written[k.String()] = true
		if k.Kind == resource.KindPolicy {
			touched[[2]string{k.Mesh, k.Type}] = true
			continue
		}
		for _, typ := range snap.KnownTypes(k.Mesh) {
			touched[[2]string{k.Mesh, typ}] = true
		}
	}
	var out []*verdictv1.ResourceChange
	for mt := range touched {
		now, err := f.conds.Partition(snap, mt[0], mt[1])
		if err != nil {
			continue
		}
		before, err := f.conds.Partition(prev, mt[0], mt[1])
		if err != nil {
			continue
		}
		for _, name := range now.Moved(before) {
			k := resource.Key{Kind: resource.KindPolicy, Mesh: mt[0], Type: mt[1], Name: name}
			e, ok := snap.Get(k)
			if !ok || written[k.String()] {
				continue
			}
			rc, err := resourceChange(engine.Change{Path: k.String(), Key: k, Resource: e.Resource})
			if err != nil {
				continue
			}
			f.fillConditions(snap, engine.Change{Resource: e.Resource}, rc)
			rc.ConditionsOnly = true
			out = append(out, rc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetKey() < out[j].GetKey() })
	return out
}

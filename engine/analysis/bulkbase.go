package analysis

// What every bulk evaluation of one (mesh, type) on one snapshot starts
// from, computed once per snapshot on first need and shared (read only) by
// its Bulks: the conditions the partition's selectors test, the valid
// workloads by name, and each workload's class as a source (its own tags).
// A Bulk copies the few maps interning writes to; Reach on a snapshot it has
// answered before interns no workload. The cache lives in the snapshot, so
// it dies with it and never serves another revision.

import (
	"maps"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// bulkBase is one partition's shared start.
type bulkBase struct {
	conds     map[string]*keyConds // frozen: each Bulk copies what it writes
	classes   map[string]int32     // frozen: the classes below
	tags      []resource.Tags      // per class
	workloads []*inventory.WorkloadEntry
	own       []ClassID // per workload, the class of its own tags
}

// baseKey is a partition's base's key among what its snapshot holds
// (engine.Snapshot.Attached).
type baseKey struct{ mesh, typ string }

// baseOf returns the partition's base, built on first call for its
// snapshot.
func baseOf(p *engine.Partition) *bulkBase {
	return p.Snapshot().Attached(baseKey{p.Mesh(), p.Type()}, func() any {
		bb := &bulkBase{}
		b := &Bulk{conds: conditionsOf(p, true), classes: map[string]int32{}}
		bb.workloads = workloadsOf(p.Inventory())
		bb.own = make([]ClassID, len(bb.workloads))
		for i, w := range bb.workloads {
			bb.own[i] = b.Intern(w.Workload.Tags)
		}
		bb.conds, bb.classes, bb.tags = b.conds, b.classes, b.tags
		return bb
	}).(*bulkBase)
}

// startFrom sets b's interning state to a copy of the base's.
func (b *Bulk) startFrom(bb *bulkBase) {
	b.base = bb
	b.conds = make(map[string]*keyConds, len(bb.conds))
	for k, c := range bb.conds {
		cc := *c
		cc.reps, cc.memo = maps.Clone(c.reps), maps.Clone(c.memo)
		b.conds[k] = &cc
	}
	b.classes = maps.Clone(bb.classes)
	b.tags = bb.tags[:len(bb.tags):len(bb.tags)] // appends copy
}

// peerClass is the class of the i-th workload of the base as an end of a
// flow named by the workload (peerTags), and those tags.
func (b *Bulk) peerClass(i int, destination bool, port uint32) (ClassID, resource.Tags) {
	w := b.base.workloads[i]
	if !destination || port == 0 || len(w.Workload.Ports) == 0 {
		return b.base.own[i], w.Workload.Tags
	}
	tags := peerTags(w, true, port)
	return b.Intern(tags), tags
}

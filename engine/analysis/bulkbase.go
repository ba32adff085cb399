package analysis

// What every bulk evaluation of one (mesh, type) on one snapshot starts
// from, computed once per snapshot on first need and shared (read only) by
// its Bulks: the conditions the partition's selectors test, the valid
// workloads, and each workload's class as a source (its own tags).
// A Bulk writes what it interns to maps of its own beside the base's; Reach
// on a snapshot it has answered before interns no workload. The base lives
// in the snapshot, so it dies with it and never serves another revision.
//
// The next snapshots of a lineage start from it (engine.Snapshot.Carried):
// a snapshot whose inventory and scopes are the base's, and whose changed
// policies test no condition the base lacks, keeps its classes. A policy
// removed may leave conditions no selector tests any longer; the classes
// stay exact (finer than needed: two tag sets of one class agree on every
// condition of the base, so on every condition tested), and the outside
// classes, which list conditions, read counted conditions that are exact.

import (
	"cmp"
	"maps"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// bulkBase is one partition's shared start.
type bulkBase struct {
	conds    map[string]*keyConds // frozen
	keys     []string             // the keys of conds, sorted
	keyConds []*keyConds          // per key of keys
	keyIdx   map[string]int32     // index of each key in keys
	classes  map[string]int32     // frozen: the classes below
	tags     []resource.Tags      // per class
	// the valid workloads in the order they lie in memory (Reach sorts
	// what it answers), each one's class as a source, and their order by
	// name, computed on first need (Matrix, Impact) and shared by the
	// bases that keep the workloads
	workloads []*inventory.WorkloadEntry
	own       []ClassID
	names     *nameOrder
	// the exact conditions on the outside keys (outside.go), and how many
	// selectors test each
	outConds  map[string]*keyConds
	outCounts map[outsideCond]int32
	// what it was computed from, for a later snapshot to compare
	inv    *inventory.Inventory
	scopes []*resource.Scope
	pset   engine.PolicySet
}

// baseKey is a partition's base's key among what its snapshot holds
// (engine.Snapshot.Carried).
type baseKey struct{ mesh, typ string }

// baseOf returns the partition's base, on first call for its snapshot
// carried from the lineage's last one when it may be, else built.
func baseOf(p *engine.Partition) *bulkBase {
	return p.Snapshot().Carried(baseKey{p.Mesh(), p.Type()}, func(prev any) any {
		pb, _ := prev.(*bulkBase)
		if pb != nil {
			if bb := pb.carry(p); bb != nil {
				return bb
			}
		}
		return buildBase(p, pb)
	}).(*bulkBase)
}

// buildBase computes a partition's base, whole but for the workloads by
// name, taken from prev (nil: none) when it is of the same inventory.
func buildBase(p *engine.Partition, prev *bulkBase) *bulkBase {
	bb := &bulkBase{conds: map[string]*keyConds{}, outCounts: map[outsideCond]int32{}, inv: p.Inventory(),
		pset: p.PolicySet()}
	// Beside the conditions, a goroutine lists the workloads in memory
	// order, then puts the rules in order for the first decision: on two
	// cores, the first question waits for neither alone.
	listed := make(chan []*inventory.WorkloadEntry, 1)
	keep := prev != nil && prev.inv == bb.inv
	go func() {
		if keep {
			listed <- prev.workloads
		} else {
			listed <- inMemoryOrder(validWorkloads(bb.inv))
		}
		ruleOrderOf(p, false)
		ruleOrderOf(p, true)
	}()
	for _, sv := range p.Scopes() {
		bb.scopes = append(bb.scopes, sv.Doc)
	}
	eachSelector(p, true, func(s *resource.Selector) {
		eachCondition(s, func(k string, kind uint8, v string) {
			addCondition(bb.conds, k, kind, v)
			if outsideKey(k) {
				bb.outCounts[outsideCond{k, kind, v}]++
			}
		})
	})
	bb.outConds = outsideConds(bb.outCounts)
	bb.keys = slices.Sorted(maps.Keys(bb.conds))
	bb.keyConds = make([]*keyConds, len(bb.keys))
	bb.keyIdx = make(map[string]int32, len(bb.keys))
	for i, k := range bb.keys {
		bb.keyConds[i], bb.keyIdx[k] = bb.conds[k], int32(i)
	}
	bb.workloads, bb.names = <-listed, &nameOrder{}
	if keep {
		bb.names = prev.names
	}
	bb.own = make([]ClassID, len(bb.workloads))
	bb.classes, bb.tags = internOwn(bb)
	return bb
}

// splitAt is how many workloads a base has at least for two Bulks to intern
// them, a half each (splitAlways: two or more, for the tests).
const splitAt = 1 << 14

var splitAlways atomic.Bool

// internOwn interns the base's workloads' own tag sets into bb.own and
// returns the classes and their tags. Interning reads every workload's tags,
// wherever they lie in memory: on two cores, two Bulks each intern a half
// in about half the time, and the classes of the second that the first
// lacks are added to the first's, in the second's order.
func internOwn(bb *bulkBase) (map[string]int32, []resource.Tags) {
	ws := bb.workloads
	parts := 1
	if runtime.GOMAXPROCS(0) > 1 && (len(ws) >= splitAt || splitAlways.Load() && len(ws) >= 2) {
		parts = 2
	}
	bs := make([]*Bulk, parts)
	var wg sync.WaitGroup
	for k := range bs {
		lo, hi := k*len(ws)/parts, (k+1)*len(ws)/parts
		b := &Bulk{classes: make(map[string]int32, (hi-lo)/4)}
		b.useKeys(bb)
		bs[k] = b
		if k == parts-1 {
			b.internAll(ws[lo:hi], bb.own[lo:hi])
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.internAll(ws[lo:hi], bb.own[lo:hi])
		}()
	}
	wg.Wait()
	first := bs[0]
	for k, b := range bs[1:] {
		keys := make([]string, len(b.tags))
		for key, id := range b.classes {
			keys[id] = key
		}
		to := make([]ClassID, len(b.tags))
		for id, key := range keys {
			c, ok := first.classes[key]
			if !ok {
				c = int32(len(first.tags))
				first.classes[key] = c
				first.tags = append(first.tags, b.tags[id])
			}
			to[id] = ClassID(c)
		}
		own := bb.own[(k+1)*len(ws)/parts : (k+2)*len(ws)/parts]
		for i, c := range own {
			own[i] = to[c]
		}
	}
	return first.classes, first.tags
}

// internAll interns the workloads' own tag sets into own.
func (b *Bulk) internAll(ws []*inventory.WorkloadEntry, own []ClassID) {
	// Replicas with one tag set share one map of tags (the inventory
	// interns them), never modified: a map met lately is interned once,
	// found by its address in a small direct-mapped table.
	type met struct {
		m unsafe.Pointer
		c ClassID
	}
	const metBits = 13
	lately := make([]met, 1<<metBits)
	for i, w := range ws {
		m := reflect.ValueOf(w.Workload.Tags).UnsafePointer()
		slot := &lately[uint64(uintptr(m)>>4)*0x9e3779b97f4a7c15>>(64-metBits)]
		if slot.m == m && m != nil {
			own[i] = slot.c
			continue
		}
		own[i] = b.Intern(w.Workload.Tags)
		*slot = met{m, own[i]}
	}
}

// carry returns the base of p's snapshot from pb, another snapshot's base
// of the same partition; nil when the inventory or the scopes differ, or a
// changed policy tests a condition pb lacks (then p's base is built whole).
// It costs O(change): the policies that changed are found by the shared
// structure of the two policy sets.
func (pb *bulkBase) carry(p *engine.Partition) *bulkBase {
	if pb.inv != p.Inventory() {
		return nil
	}
	sv := p.Scopes()
	if len(sv) != len(pb.scopes) {
		return nil
	}
	for i := range sv {
		if sv[i].Doc != pb.scopes[i] {
			return nil
		}
	}
	pset := p.PolicySet()
	names, ok := pset.Changed(pb.pset)
	if !ok {
		return nil
	}
	var counts map[outsideCond]int32 // cloned on the first change to it
	count := func(doc *resource.Policy, d int32) {
		for _, s := range policySelectors(doc) {
			eachCondition(s, func(k string, kind uint8, v string) {
				if !outsideKey(k) {
					return
				}
				if counts == nil {
					counts = maps.Clone(pb.outCounts)
				}
				c := outsideCond{k, kind, v}
				if counts[c] += d; counts[c] == 0 {
					delete(counts, c)
				}
			})
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, name := range names {
		old, had := pb.pset.Policy(name)
		cur, has := p.Policy(name)
		if had && has && old.Doc == cur.Doc {
			continue // compiled anew, or a neighbour in the map: same selectors
		}
		if has {
			for _, s := range policySelectors(cur.Doc) {
				if !covered(pb.conds, s) {
					return nil
				}
			}
			count(cur.Doc, 1)
		}
		if had {
			count(old.Doc, -1)
		}
	}
	nb := *pb
	nb.pset = pset
	if counts != nil {
		nb.outCounts, nb.outConds = counts, outsideConds(counts)
	}
	return &nb
}

// startFrom makes b intern on top of the base: it reads the base's classes
// and writes new ones to its own.
func (b *Bulk) startFrom(bb *bulkBase) {
	b.base = bb
	b.useKeys(bb)
	b.outConds = bb.outConds
	b.tags = bb.tags[:len(bb.tags):len(bb.tags)] // appends copy
}

// useKeys sets the keys b interns by.
func (b *Bulk) useKeys(bb *bulkBase) {
	b.keys, b.keyConds, b.keyIdx = bb.keys, bb.keyConds, bb.keyIdx
}

// peerClass is the class of the i-th workload of the base as an end of a
// flow named by the workload (peerTags), and those tags; own says they are
// the workload's own tags.
func (b *Bulk) peerClass(i int, destination bool, port uint32) (c ClassID, tags resource.Tags, own bool) {
	w := b.base.workloads[i]
	if !destination {
		port = 0
	}
	if pt, _ := w.Workload.PortTags(port); len(pt) == 0 {
		return b.base.own[i], peerTags(w, false, 0), true
	}
	tags = peerTags(w, true, port)
	return b.Intern(tags), tags, false
}

// nameOrder is the order by name of a base's workloads: byName[i] is the
// index of the i-th.
type nameOrder struct {
	once   sync.Once
	byName []int32
}

// byName returns the base's workloads' indexes in the order of their names.
func (bb *bulkBase) byName() []int32 {
	o := bb.names
	o.once.Do(func() { o.byName = orderByName(bb.workloads) })
	return o.byName
}

// validWorkloads lists the valid workloads of an inventory (nil: none) in
// no particular order.
func validWorkloads(inv *inventory.Inventory) []*inventory.WorkloadEntry {
	if inv == nil {
		return nil
	}
	out := make([]*inventory.WorkloadEntry, 0, inv.ByName.Len())
	inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
		if e.Err == "" {
			out = append(out, e)
		}
		return true
	})
	return out
}

// inMemoryOrder orders ws by where their workloads lie in memory: a walk
// over them then reads memory forward, which the inventory's order (by
// hash) does not. Many are ordered by a radix sort of the addresses, 16
// bits a pass.
func inMemoryOrder(ws []*inventory.WorkloadEntry) []*inventory.WorkloadEntry {
	type at struct {
		a uint64
		e *inventory.WorkloadEntry
	}
	l := make([]at, len(ws))
	var lo, hi uint64 = math.MaxUint64, 0
	for i, w := range ws {
		a := uint64(uintptr(unsafe.Pointer(w.Workload)))
		l[i] = at{a, w}
		lo, hi = min(lo, a), max(hi, a)
	}
	if len(ws) < 1<<12 {
		slices.SortFunc(l, func(x, y at) int { return cmp.Compare(x.a, y.a) })
	} else {
		tmp, count := make([]at, len(ws)), make([]int32, 1<<16+1)
		for shift := 0; shift < 64 && (hi-lo)>>shift > 0; shift += 16 {
			clear(count)
			for _, x := range l {
				count[((x.a-lo)>>shift)&0xffff+1]++
			}
			for i := 1; i < len(count); i++ {
				count[i] += count[i-1]
			}
			for _, x := range l {
				b := ((x.a - lo) >> shift) & 0xffff
				tmp[count[b]] = x
				count[b]++
			}
			l, tmp = tmp, l
		}
	}
	for i := range l {
		ws[i] = l[i].e
	}
	return ws
}

// orderByName returns the indexes of ws in the order of the workloads'
// names.
func orderByName(ws []*inventory.WorkloadEntry) []int32 {
	// Sorted by the names beside the indexes: a comparison reads no entry.
	type named struct {
		name string
		i    int32
	}
	byName := make([]named, len(ws))
	for i, w := range ws {
		byName[i] = named{w.Workload.Name, int32(i)}
	}
	slices.SortFunc(byName, func(a, b named) int { return strings.Compare(a.name, b.name) })
	out := make([]int32, len(ws))
	for i := range byName {
		out[i] = byName[i].i
	}
	return out
}

// workloadsOf lists the valid workloads of an inventory (nil: none) by name.
func workloadsOf(inv *inventory.Inventory) []*inventory.WorkloadEntry {
	ws := validWorkloads(inv)
	out := make([]*inventory.WorkloadEntry, len(ws))
	for i, j := range orderByName(ws) {
		out[i] = ws[j]
	}
	return out
}

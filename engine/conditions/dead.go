package conditions

// NoWorkloads (lint's dead, docs/lint.md): a valid policy, in a mesh that
// has workloads, that selects none of them. It is judged by witnesses: a
// policy that selects some workload keeps the name of one (its witness), so
// that a change of the inventory re-judges only
//   - the policies whose witness changed (put again, deleted, made
//     invalid): the witness is checked again, and only when it no longer
//     serves a new one is searched for;
//   - the dead policies that a put workload may make alive, found by one
//     tag each end of theirs requires (or kept apart when it requires none).
//
// A search for a witness reads the mesh's valid workloads through an index
// by the tag pairs and keys they present (their own tags and their ports'),
// and walks the shortest posting an end's exact pairs or present keys name.

import (
	"slices"
	"sync"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// meshWorkloads indexes the valid workloads of one mesh's inventory. A
// tracker keeps one per mesh, shared by the mesh's partitions, and brings
// it to the inventory a judgement reads by a diff of the two (O(change));
// mu serializes its users.
type meshWorkloads struct {
	mu    sync.Mutex
	built bool
	of    *inventory.Inventory
	// valid gives each valid workload's slot in slots (free: a free list
	// of the nil ones): the postings hold slots, a third of names' size.
	valid map[string]int32
	slots []*inventory.WorkloadEntry
	free  []int32
	// byPair and byKey: the valid workloads presenting a tag pair, a tag
	// key, in their own tags or a port's.
	byPair map[index.TagKV]map[int32]struct{}
	byKey  map[string]map[int32]struct{}
	// names are the valid workloads' names, sorted; kept only once asked
	// (sorted), dropped by a large change.
	names  []string
	sorted bool
}

// meshWorkloads returns the tracker's index of mesh's workloads.
func (t *Tracker) meshWorkloads(mesh string) *meshWorkloads {
	t.mu.Lock()
	defer t.mu.Unlock()
	mw := t.meshes[mesh]
	if mw == nil {
		mw = &meshWorkloads{}
		t.meshes[mesh] = mw
	}
	return mw
}

var emptyByName = pmap.New[string, *inventory.WorkloadEntry](pmap.StringHash)

// byName is inv's workloads by name (none for a nil inventory).
func byName(inv *inventory.Inventory) pmap.Map[string, *inventory.WorkloadEntry] {
	if inv == nil {
		return emptyByName
	}
	return inv.ByName
}

// movedWorkloads lists the workloads whose entries differ between two
// inventories: put, deleted, or made valid or invalid.
func movedWorkloads(a, b *inventory.Inventory) []string {
	var out []string
	seen := map[string]bool{}
	pmap.Diff(byName(a), byName(b), func(x, y *inventory.WorkloadEntry) bool { return x == y }, func(name string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	})
	return out
}

// at brings the index to inv (call with mu held).
func (mw *meshWorkloads) at(inv *inventory.Inventory) {
	if mw.built && mw.of == inv {
		return
	}
	var moved []string
	if mw.built {
		moved = movedWorkloads(mw.of, inv)
	}
	if !mw.built || len(moved) > 1024 && len(moved) > len(mw.valid)/4 {
		mw.valid, mw.slots, mw.free = map[string]int32{}, nil, nil
		mw.byPair, mw.byKey = map[index.TagKV]map[int32]struct{}{}, map[string]map[int32]struct{}{}
		mw.names, mw.sorted = nil, false
		byName(inv).Range(func(_ string, e *inventory.WorkloadEntry) bool {
			mw.add(e)
			return true
		})
		mw.built, mw.of = true, inv
		return
	}
	if len(moved) > 64 {
		mw.names, mw.sorted = nil, false // cheaper sorted again on the next ask
	}
	for _, name := range moved {
		mw.remove(name)
		if e, ok := byName(inv).Get(name); ok {
			mw.add(e)
		}
	}
	mw.of = inv
}

// presented calls f with every tag pair a workload presents: its own and
// each port's.
func presented(w *resource.Workload, f func(k, v string)) {
	for k, v := range w.Tags {
		f(k, v)
	}
	for _, p := range w.Ports {
		for k, v := range p.Tags {
			f(k, v)
		}
	}
}

func (mw *meshWorkloads) add(e *inventory.WorkloadEntry) {
	if e.Err != "" {
		return
	}
	name := e.Workload.Name
	var slot int32
	if n := len(mw.free); n > 0 {
		slot, mw.free = mw.free[n-1], mw.free[:n-1]
		mw.slots[slot] = e
	} else {
		slot = int32(len(mw.slots))
		mw.slots = append(mw.slots, e)
	}
	mw.valid[name] = slot
	presented(e.Workload, func(k, v string) {
		addTo(mw.byPair, index.TagKV{K: k, V: v}, slot)
		addTo(mw.byKey, k, slot)
	})
	if mw.sorted {
		if i, found := slices.BinarySearch(mw.names, name); !found {
			mw.names = slices.Insert(mw.names, i, name)
		}
	}
}

func (mw *meshWorkloads) remove(name string) {
	slot, ok := mw.valid[name]
	if !ok {
		return
	}
	e := mw.slots[slot]
	delete(mw.valid, name)
	mw.slots[slot] = nil
	mw.free = append(mw.free, slot)
	presented(e.Workload, func(k, v string) {
		removeFrom(mw.byPair, index.TagKV{K: k, V: v}, slot)
		removeFrom(mw.byKey, k, slot)
	})
	if mw.sorted {
		if i, found := slices.BinarySearch(mw.names, name); found {
			mw.names = slices.Delete(mw.names, i, i+1)
		}
	}
}

func addTo[K, V comparable](m map[K]map[V]struct{}, k K, v V) {
	set := m[k]
	if set == nil {
		set = map[V]struct{}{}
		m[k] = set
	}
	set[v] = struct{}{}
}

func removeFrom[K, V comparable](m map[K]map[V]struct{}, k K, v V) {
	if set := m[k]; set != nil {
		delete(set, v)
		if len(set) == 0 {
			delete(m, k)
		}
	}
}

// entry returns the valid workload named name.
func (mw *meshWorkloads) entry(name string) (*inventory.WorkloadEntry, bool) {
	slot, ok := mw.valid[name]
	if !ok {
		return nil, false
	}
	return mw.slots[slot], true
}

// first returns the first n valid workloads by name.
func (mw *meshWorkloads) first(n int) []*inventory.WorkloadEntry {
	if !mw.sorted {
		mw.names = mw.names[:0]
		for name := range mw.valid {
			mw.names = append(mw.names, name)
		}
		slices.Sort(mw.names)
		mw.sorted = true
	}
	out := make([]*inventory.WorkloadEntry, 0, min(n, len(mw.names)))
	for _, name := range mw.names[:min(n, len(mw.names))] {
		e, _ := mw.entry(name)
		out = append(out, e)
	}
	return out
}

// selEnd is one end of a policy that may select a workload: a rule's end on
// a side where the rule is a candidate (the workload then a member of the
// rule's scope), or a targetRef policy's target on the destination side.
type selEnd struct {
	m      *index.Matcher // nil: every tag set
	side   int
	scope  int32
	member bool // the scope's membership counts
}

// ends lists the policy's ends.
func (p *pstate) ends() []selEnd {
	if len(p.rules) == 0 && p.doc.TargetRef != nil {
		// A configuration by targetRef alone (a single default, blocks):
		// it selects the workloads its targetRef selects.
		return []selEnd{{m: index.CompileSelector(resource.TargetSelector(*p.doc.TargetRef)), side: 1}}
	}
	var out []selEnd
	for _, r := range p.rules {
		for side := 0; side < 2; side++ {
			if r.Sides&index.SideBits[side] == 0 {
				continue
			}
			m := r.Src
			if side == 1 {
				m = r.Dst
			}
			out = append(out, selEnd{m: m, side: side, scope: r.Scope, member: true})
		}
	}
	return out
}

// selects reports whether the end selects a tag set the workload presents
// on its side: as a source its own tags; as a destination its own, and
// with each port's.
func (end *selEnd) selects(p *engine.Partition, w *resource.Workload) bool {
	holds := func(t resource.Tags) bool {
		return (end.m == nil || end.m.Matches(t)) && (!end.member || p.MemberOf(end.scope, t))
	}
	if holds(w.Tags) {
		return true
	}
	if end.side == 1 {
		for _, pt := range w.Ports {
			if holds(w.ResolvedTags(pt.Port, "")) {
				return true
			}
		}
	}
	return false
}

// candidates calls f with the valid workloads that may present a tag set
// m matches, until f returns false: the shortest posting of an exact pair
// or a present key m requires, else every valid workload.
func (mw *meshWorkloads) candidates(m *index.Matcher, f func(e *inventory.WorkloadEntry) bool) {
	var set map[int32]struct{}
	narrowed := false
	if m != nil {
		for _, kv := range m.Exact {
			if s := mw.byPair[kv]; !narrowed || len(s) < len(set) {
				set, narrowed = s, true
			}
		}
		for _, k := range m.Present {
			if s := mw.byKey[k]; !narrowed || len(s) < len(set) {
				set, narrowed = s, true
			}
		}
	}
	if !narrowed {
		for _, e := range mw.slots {
			if e != nil && !f(e) {
				return
			}
		}
		return
	}
	for slot := range set {
		if !f(mw.slots[slot]) {
			return
		}
	}
}

// witness returns a valid workload the policy selects; "" when none.
func (mw *meshWorkloads) witness(p *engine.Partition, ps *pstate) string {
	if ps.err != "" {
		return ""
	}
	found := ""
	for _, end := range ps.ends() {
		mw.candidates(end.m, func(e *inventory.WorkloadEntry) bool {
			if end.selects(p, e.Workload) {
				found = e.Workload.Name
			}
			return found == ""
		})
		if found != "" {
			break
		}
	}
	return found
}

// selectsWorkload reports whether the policy selects the workload.
func selectsWorkload(p *engine.Partition, ps *pstate, w *resource.Workload) bool {
	for _, end := range ps.ends() {
		if end.selects(p, w) {
			return true
		}
	}
	return false
}

// deadIndex is what a tracker keeps of one partition's NoWorkloads: the
// policies each workload witnesses, and the dead policies by one tag each
// of their ends requires. It is updated in place by each judgement.
type deadIndex struct {
	witnessed map[string]map[string]struct{} // workload → the policies it witnesses
	dead      map[deadKey]map[string]struct{}
}

// deadKey files a dead policy's end: by a pair it requires on a side
// (exact), a key it requires present, or neither (any).
type deadKey struct {
	side    int
	k, v    string
	present bool
	any     bool
}

func newDeadIndex() *deadIndex {
	return &deadIndex{witnessed: map[string]map[string]struct{}{}, dead: map[deadKey]map[string]struct{}{}}
}

// keysOf lists the keys a dead policy is filed under, one per end.
func keysOf(ps *pstate) []deadKey {
	ends := ps.ends()
	out := make([]deadKey, 0, len(ends))
	for _, end := range ends {
		switch {
		case end.m != nil && len(end.m.Exact) > 0:
			out = append(out, deadKey{side: end.side, k: end.m.Exact[0].K, v: end.m.Exact[0].V})
		case end.m != nil && len(end.m.Present) > 0:
			out = append(out, deadKey{side: end.side, k: end.m.Present[0], present: true})
		default:
			out = append(out, deadKey{any: true})
		}
	}
	return out
}

func (dx *deadIndex) add(name string, ps *pstate) {
	switch {
	case ps.witness != "":
		addTo(dx.witnessed, ps.witness, name)
	case ps.err == "":
		for _, k := range keysOf(ps) {
			addTo(dx.dead, k, name)
		}
	}
}

func (dx *deadIndex) remove(name string, ps *pstate) {
	switch {
	case ps.witness != "":
		removeFrom(dx.witnessed, ps.witness, name)
	case ps.err == "":
		for _, k := range keysOf(ps) {
			removeFrom(dx.dead, k, name)
		}
	}
}

// mayWake calls f with the dead policies an end of which may select the
// workload.
func (dx *deadIndex) mayWake(w *resource.Workload, f func(policy string)) {
	each := func(k deadKey) {
		for name := range dx.dead[k] {
			f(name)
		}
	}
	each(deadKey{any: true})
	for k, v := range w.Tags {
		for side := 0; side < 2; side++ {
			each(deadKey{side: side, k: k, v: v})
			each(deadKey{side: side, k: k, present: true})
		}
	}
	for _, p := range w.Ports {
		for k, v := range p.Tags {
			each(deadKey{side: 1, k: k, v: v})
			each(deadKey{side: 1, k: k, present: true})
		}
	}
}

// judgeDead settles NoWorkloads: from scratch when the frame changed, the
// partition is new to the tracker or the mesh gained its first workload or
// lost its last; else for the changed policies and for those the
// inventory's change may move (the file comment).
func (j *judgement) judgeDead(mw *meshWorkloads, frame bool, changed []string, sameInv bool) {
	st, base, tp := j.st, j.base, j.tp
	st.workloads = len(mw.valid)
	// set gives the policy (filed in tp.dead as ps) its witness, w.
	set := func(name string, ps *pstate, w string) {
		dead := ps.err == "" && w == "" && st.workloads > 0
		if ps.witness == w && ps.dead == dead {
			return
		}
		tp.dead.remove(name, ps)
		if _, fresh := j.fresh[name]; !fresh {
			ps = j.edit(name)
		}
		ps.witness, ps.dead = w, dead
		tp.dead.add(name, ps)
	}
	if !frame || base == nil || (base.workloads > 0) != (st.workloads > 0) {
		tp.dead = newDeadIndex()
		var names []string
		j.b.Range(func(name string, _ *pstate) bool {
			names = append(names, name)
			return true
		})
		for _, name := range names {
			ps, _ := j.b.Get(name)
			if _, fresh := j.fresh[name]; fresh {
				ps.witness, ps.dead = "", false
			}
			tp.dead.add(name, ps)
			set(name, ps, mw.witness(j.p, ps))
		}
		tp.deadOf = st
		return
	}
	if tp.dead == nil || tp.deadOf != base {
		tp.dead = newDeadIndex()
		base.policies.Range(func(name string, ps *pstate) bool {
			tp.dead.add(name, ps)
			return true
		})
	}
	for _, name := range changed {
		if old, ok := base.policies.Get(name); ok {
			tp.dead.remove(name, old)
		}
		if ps, ok := j.fresh[name]; ok {
			ps.witness, ps.dead = "", false
			tp.dead.add(name, ps)
			set(name, ps, mw.witness(j.p, ps))
		}
	}
	if !sameInv {
		// The workloads the change moved: their witnessed policies are
		// checked again, the dead ones they may select tried on them.
		recheck := map[string]bool{}
		woken := map[string]string{}
		for _, w := range movedWorkloads(base.inv, st.inv) {
			for name := range tp.dead.witnessed[w] {
				recheck[name] = true
			}
			e, ok := mw.entry(w)
			if !ok {
				continue
			}
			tp.dead.mayWake(e.Workload, func(name string) {
				if _, done := woken[name]; done {
					return
				}
				if ps, ok := j.b.Get(name); ok && selectsWorkload(j.p, ps, e.Workload) {
					woken[name] = w
				}
			})
		}
		for name := range recheck {
			ps, ok := j.b.Get(name)
			if !ok {
				continue
			}
			if e, ok := mw.entry(ps.witness); ok && selectsWorkload(j.p, ps, e.Workload) {
				continue
			}
			set(name, ps, mw.witness(j.p, ps))
		}
		for name, w := range woken {
			ps, _ := j.b.Get(name)
			set(name, ps, w)
		}
	}
	tp.deadOf = st
}

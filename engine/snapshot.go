package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Snapshot is an immutable, indexed view of every resource at one revision.
// Readers share it freely without locks; a change makes a new snapshot (Apply)
// that shares all untouched structure with this one.
//
// Structure: meshes (a persistent map) → per mesh its settings, its compiled scope
// tree, and a persistent map of type partitions → per partition a persistent map
// of policies and the rule index (see index.go). A policy change rebuilds only
// the posting lists its rules are filed in and the map paths above them: O(change).
// A Mesh or Scope change recompiles that one mesh, since a scope's place in the
// order or its membership can affect every rule in it.
type Snapshot struct {
	revision int64
	meshes   pmap.Map[string, *meshState]
	broken   pmap.Map[string, *InvalidResource] // stored values that failed to decode
	taints   map[string]*taint                  // what the broken values close, by mesh (invalid.go); nil: nothing
	count    int                                // decoded resources, valid or not
	// memo remembers answers (cache.go); shared with the snapshots Apply
	// makes, its entries checked against their partition's epoch.
	memo *memoHolder
	// attached holds what callers compute from this snapshot alone
	// (Attached): never copied to another snapshot.
	attached sync.Map
	// lineage carries values from snapshot to snapshot (carry.go); shared
	// with the snapshots Apply makes.
	lineage *lineage
	// part is the first partition decided here (partRef): set once, never
	// copied to another snapshot.
	part atomic.Pointer[partRef]
}

// InvalidResource is a stored resource verdict does not use: a value that failed
// to decode or validate, or a valid resource in conflict with an earlier one
// (docs/storage.md).
type InvalidResource struct {
	Path        string       // the key without prefix as stored, its bytes as they are (RenderPath shows it): "default/policies/TrafficLog/x"
	Key         resource.Key // zero when the path itself is not a valid key
	Resource    resource.Resource
	Err         error
	Value       []byte // the stored bytes of a broken value
	ModRevision int64
}

// Change is one event: a put (Resource set), a delete (Resource nil, Err nil), or
// a stored value that failed to decode (Err set; the key holds nothing usable).
type Change struct {
	Path     string // the key without prefix as stored (raw bytes, RenderPath shows it); Key.String() when Key is set
	Key      resource.Key
	Resource resource.Resource
	Err      error
	// Value is the stored bytes of a broken value (Err set); Digest hashes them.
	Value []byte
	// ModRevision of a broken value (Err set).
	ModRevision int64
}

// Put returns the change that stores r.
func Put(r resource.Resource) Change {
	return Change{Path: r.Key().String(), Key: r.Key(), Resource: r}
}

// Delete returns the change that removes the resource at k.
func Delete(k resource.Key) Change { return Change{Path: k.String(), Key: k} }

func newSnapshot() *Snapshot {
	return &Snapshot{
		meshes:  pmap.New[string, *meshState](pmap.StringHash),
		broken:  pmap.New[string, *InvalidResource](pmap.StringHash),
		memo:    &memoHolder{},
		lineage: &lineage{},
	}
}

// Build compiles resources into a snapshot at revision.
func Build(revision int64, resources []resource.Resource) *Snapshot {
	changes := make([]Change, len(resources))
	for i, r := range resources {
		changes[i] = Put(r)
	}
	return newSnapshot().Apply(revision, changes)
}

// Empty returns a snapshot with no resources.
func Empty() *Snapshot { return newSnapshot() }

// Revision returns the revision the snapshot reflects.
func (s *Snapshot) Revision() int64 { return s.revision }

// Len returns the number of resources, valid or not, broken values included.
func (s *Snapshot) Len() int { return s.count + s.broken.Len() }

// Apply returns the snapshot after changes, at revision. Later changes to one key
// win over earlier ones. s is not modified.
func (s *Snapshot) Apply(revision int64, changes []Change) *Snapshot {
	return s.apply(revision, changes, false)
}

// apply is Apply; with check, the result serves only to tell which resources
// it holds and which are invalid (CheckApply): a policy partition updated
// incrementally keeps its predecessor's rule indexes, which then do not
// match its policies — such a snapshot must never decide nor be served.
func (s *Snapshot) apply(revision int64, changes []Change, check bool) *Snapshot {
	out := &Snapshot{revision: revision, meshes: s.meshes, broken: s.broken, taints: s.taints, count: s.count, memo: s.memo,
		lineage: s.lineage}
	if len(changes) == 0 {
		return out
	}
	// Last change per path wins; keep first-seen order for determinism.
	last := make(map[string]int, len(changes))
	for i, c := range changes {
		if c.Path == "" && c.Resource != nil {
			changes[i].Path = c.Resource.Key().String()
			changes[i].Key = c.Resource.Key()
		}
		last[changes[i].Path] = i
	}
	bb := s.broken.Builder()
	// Sized first: a cold start hands over every resource in one Apply, and
	// growing a mesh's list by appends copied it a dozen times.
	perMesh := map[string]int{}
	for i, c := range changes {
		if last[c.Path] == i && c.Key.Kind != 0 {
			perMesh[c.Key.Mesh]++
		}
	}
	byMesh := make(map[string][]Change, len(perMesh))
	var meshOrder []string
	brokenChanged := false
	for i, c := range changes {
		if last[c.Path] != i {
			continue
		}
		if c.Err != nil || s.broken.Len() > 0 && !brokenChanged {
			_, was := bb.Get(c.Path)
			brokenChanged = was || c.Err != nil
		}
		if c.Err != nil {
			bb.Set(c.Path, &InvalidResource{Path: c.Path, Key: c.Key, Err: c.Err, Value: c.Value, ModRevision: c.ModRevision})
		} else {
			bb.Delete(c.Path)
		}
		if c.Key.Kind == 0 {
			continue // an unparseable key: nothing in any mesh
		}
		if _, ok := byMesh[c.Key.Mesh]; !ok {
			meshOrder = append(meshOrder, c.Key.Mesh)
			if perMesh[c.Key.Mesh] == len(changes) {
				// One mesh takes every change, each the last of its
				// path (a cold start): its list is changes itself.
				byMesh[c.Key.Mesh] = changes
				continue
			}
			byMesh[c.Key.Mesh] = make([]Change, 0, perMesh[c.Key.Mesh])
		}
		if perMesh[c.Key.Mesh] != len(changes) {
			byMesh[c.Key.Mesh] = append(byMesh[c.Key.Mesh], c)
		}
	}
	out.broken = bb.Map()
	if brokenChanged {
		out.taints = brokenTaints(out.broken.Range)
	}
	mb := s.meshes.Builder()
	for _, name := range meshOrder {
		old, _ := mb.Get(name)
		nm := old.applyAll(name, byMesh[name], check)
		if old != nil {
			out.count -= old.total()
		}
		if nm == nil {
			mb.Delete(name)
			continue
		}
		out.count += nm.total()
		mb.Set(name, nm)
	}
	out.meshes = mb.Map()
	return out
}

// meshState is one mesh: its settings, scopes and type partitions.
type meshState struct {
	name      string
	doc       *resource.Mesh // nil: implicit, with defaults
	settings  meshSettings
	scopeDocs pmap.Map[string, *resource.Scope]
	scopes    *scopeTable
	types     pmap.Map[string, *typeState]
	count     int                  // the mesh document, scopes and policies, valid or not
	invalid   int                  // policies invalid in their mesh (typeState.invalid summed)
	declared  map[string]bool      // types named by the Mesh or a scope (types.go)
	inv       *inventory.Inventory // workloads (inventory.go); nil for none
	// epoch marks the memo's answers of the types with no policy (cache.go):
	// renewed by rebuildMesh (a Mesh or Scope change).
	epoch *memoEpoch
}

// total is the number of resources of the mesh, workloads included.
func (m *meshState) total() int { return m.count + m.inv.Len() }

// applyAll returns the mesh after changes; nil when it holds no resource.
// Workload changes update the inventory alone: they never recompile scopes or
// policies.
func (m *meshState) applyAll(name string, changes []Change, check bool) *meshState {
	nw := 0
	for _, c := range changes {
		if c.Key.Kind == resource.KindWorkload {
			nw++
		}
	}
	workloads, rest := []inventory.WorkloadChange(nil), changes
	if nw > 0 {
		workloads, rest = make([]inventory.WorkloadChange, 0, nw), make([]Change, 0, len(changes)-nw)
		for _, c := range changes {
			if c.Key.Kind == resource.KindWorkload {
				w, _ := c.Resource.(*resource.Workload)
				workloads = append(workloads, inventory.WorkloadChange{Name: c.Key.Name, Workload: w})
			} else {
				rest = append(rest, c)
			}
		}
	}
	var inv *inventory.Inventory
	if m != nil {
		inv = m.inv
	}
	if len(workloads) > 0 {
		inv = inv.Apply(workloads)
	}
	var out *meshState
	switch {
	case len(rest) > 0 || m == nil:
		out = m.apply(name, rest, check)
	default:
		c := *m
		out = &c
	}
	out.inv = inv
	if out.total() == 0 {
		return nil
	}
	return out
}

// apply returns the mesh after changes to its document, scopes and policies
// (with check, see Snapshot.apply).
func (m *meshState) apply(name string, changes []Change, check bool) *meshState {
	rebuild := m == nil
	for _, c := range changes {
		if c.Key.Kind != resource.KindPolicy {
			rebuild = true
		}
	}
	if rebuild {
		return rebuildMesh(name, m, changes)
	}
	out := *m
	byType := map[string][]Change{}
	var typeOrder []string
	for _, c := range changes {
		if _, ok := byType[c.Key.Type]; !ok {
			typeOrder = append(typeOrder, c.Key.Type)
		}
		byType[c.Key.Type] = append(byType[c.Key.Type], c)
	}
	tb := m.types.Builder()
	for _, t := range typeOrder {
		old, _ := tb.Get(t)
		nt := old.apply(t, &out, byType[t], check)
		if old != nil {
			out.count -= old.policies.Len()
			out.invalid -= old.invalid
		}
		if nt == nil {
			tb.Delete(t)
			continue
		}
		out.count += nt.policies.Len()
		out.invalid += nt.invalid
		tb.Set(t, nt)
	}
	out.types = tb.Map()
	return &out
}

// rebuildMesh compiles a mesh from scratch: its resources in old plus changes.
func rebuildMesh(name string, old *meshState, changes []Change) *meshState {
	var doc *resource.Mesh
	scopes := pmap.New[string, *resource.Scope](pmap.StringHash)
	// Per type, its policies then, in order, the puts and deletes of the
	// changes; sorted by name below, where the last of a name wins.
	policies := map[string][]namedPolicy{}
	if old != nil {
		doc = old.doc
		scopes = old.scopeDocs
		old.types.Range(func(t string, ts *typeState) bool {
			list := make([]namedPolicy, 0, ts.policies.Len())
			ts.policies.Range(func(name string, cp *compiledPolicy) bool {
				list = append(list, namedPolicy{name, cp.p})
				return true
			})
			policies[t] = list
			return true
		})
	}
	sb := scopes.Builder()
	for _, c := range changes {
		switch c.Key.Kind {
		case resource.KindMesh:
			doc, _ = c.Resource.(*resource.Mesh)
		case resource.KindScope:
			if s, ok := c.Resource.(*resource.Scope); ok {
				sb.Set(c.Key.Name, s)
			} else {
				sb.Delete(c.Key.Name)
			}
		case resource.KindPolicy:
			if p, ok := c.Resource.(*resource.Policy); ok {
				policies[p.Type] = append(policies[p.Type], namedPolicy{p.Name, p})
			} else if l, ok := policies[c.Key.Type]; ok {
				policies[c.Key.Type] = append(l, namedPolicy{c.Key.Name, nil})
			}
		}
	}
	m := &meshState{name: name, doc: doc, settings: settingsOf(doc), scopeDocs: sb.Map(),
		types: pmap.New[string, *typeState](pmap.StringHash), epoch: &memoEpoch{}}
	var scopeList []*resource.Scope
	m.scopeDocs.Range(func(_ string, s *resource.Scope) bool {
		scopeList = append(scopeList, s)
		return true
	})
	sort.Slice(scopeList, func(i, j int) bool { return scopeList[i].Name < scopeList[j].Name })
	m.scopes = buildScopes(scopeList)
	m.declared = declaredTypes(doc, scopeList)
	m.count = len(scopeList)
	if doc != nil {
		m.count++
	}
	typeNames := make([]string, 0, len(policies))
	for t := range policies {
		typeNames = append(typeNames, t)
	}
	// Partitions are independent: built concurrently, each reading m alone.
	built := make([]*typeState, len(typeNames))
	index.Parallel(len(typeNames), func(i int) {
		if list := byName(policies[typeNames[i]]); len(list) > 0 {
			built[i] = buildType(typeNames[i], m, list)
		}
	})
	tb := m.types.Builder()
	for i, ts := range built {
		if ts == nil {
			continue
		}
		m.count += ts.policies.Len()
		m.invalid += ts.invalid
		tb.Set(typeNames[i], ts)
	}
	m.types = tb.Map()
	return m
}

// namedPolicy is a put (p set) or a delete (p nil) of a policy by name.
type namedPolicy struct {
	name string
	p    *resource.Policy
}

// byName returns the policies of l sorted by name: of several entries of a
// name, the last in l wins (a delete removes the name).
func byName(l []namedPolicy) []*resource.Policy {
	idx := make([]int32, len(l))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		if c := strings.Compare(l[a].name, l[b].name); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	out := make([]*resource.Policy, 0, len(l))
	for j, i := range idx {
		if j+1 < len(idx) && l[idx[j+1]].name == l[i].name {
			continue // a later entry of the name wins
		}
		if l[i].p != nil {
			out = append(out, l[i].p)
		}
	}
	return out
}

// typeState is the partition of one mesh and type: its policies and rule index.
type typeState struct {
	name     string
	policies pmap.Map[string, *compiledPolicy]
	// counts over the policies whose scope reference is valid
	counts formCounts
	// counts over the valid policies
	valid      formCounts
	conflicted bool // some policies are invalid for mixing forms; every change re-checks all
	invalid    int
	rules      *index.Index
	attachIn   *index.Index // targetRef policies with from items, by their targetRef
	attachOut  *index.Index // targetRef policies with to items, by their targetRef
	scopeRules []int32      // valid S&D rules per scope ord; [0] = the mesh root
	// epoch marks the memo's answers of this partition (cache.go): every
	// change of the partition makes a new one.
	epoch *memoEpoch
	// Audit rules (docs/audit.md) live apart, so the enforced decision never
	// sees them: the same structures over the audit rules alone, and the
	// counts of the valid policies in audit mode. An audit policy's rules are
	// all audit rules; Kuma's AllowWithShadowDeny adds an audit DENY to an
	// enforced policy.
	audit      auditRules
	validAudit formCounts
	dest       *destIndex // select: PerDestination, the inbound choice's index (destindex.go)
}

// auditRules are a partition's audit rules, filed as the enforced ones are.
type auditRules struct {
	rules      *index.Index
	attachIn   *index.Index
	attachOut  *index.Index
	scopeRules []int32
}

// audited reports whether the partition has an audit policy or rule: without
// one (and without an audit scope in the mesh), Decide does no shadow work.
func (ts *typeState) audited() bool {
	return ts != nil && (ts.validAudit.policies > 0 || ts.audit.rules.Size > 0)
}

// enforcedCounts are the counts of the valid policies the enforced decision sees.
func (ts *typeState) enforcedCounts() formCounts {
	c, a := ts.valid, &ts.validAudit
	c.policies -= a.policies
	c.sd -= a.sd
	c.tr -= a.tr
	c.from -= a.from
	c.to -= a.to
	c.items -= a.items
	c.blocks -= a.blocks
	return c
}

// ruleSets collects the rules of policies entering or leaving a partition, the
// enforced ones at [0] and the audit ones at [1].
type ruleSets struct {
	rules, in, out [2][]*index.Rule
}

func auditIdx(audit bool) int {
	if audit {
		return 1
	}
	return 0
}

// add files cp's rules; sr[0] and sr[1] are the per-scope S&D rule counts
// (enforced, audit), changed by d.
func (rs *ruleSets) add(cp *compiledPolicy, sr [2][]int32, d int32) {
	for _, r := range cp.rules {
		i := auditIdx(r.Audit)
		rs.rules[i] = append(rs.rules[i], r)
		if cp.p.TargetRef == nil {
			sr[i][cp.scopeOrd()] += d
		}
	}
	for _, a := range cp.attach {
		i := auditIdx(a.Audit)
		if a.Sides == index.SideIn {
			rs.in[i] = append(rs.in[i], a)
		} else {
			rs.out[i] = append(rs.out[i], a)
		}
	}
}

type formCounts struct {
	policies, sd, tr, from, to, items, blocks int
}

func (c *formCounts) add(p *resource.Policy, d int) {
	c.policies += d
	if p.TargetRef == nil {
		c.sd += d
	} else {
		c.tr += d
	}
	if len(p.From) > 0 {
		c.from += d
	}
	if len(p.To) > 0 {
		c.to += d
	}
	if p.HasItems() {
		c.items += d
	}
	if p.HasBlocks() {
		c.blocks += d
	}
}

func (c *formCounts) mixed() bool {
	return (c.sd > 0 && c.tr > 0) || (c.items > 0 && c.blocks > 0)
}

// scopeCheck returns the scope a policy names, or why it cannot be used.
func (m *meshState) scopeCheck(p *resource.Policy) (*scopeInfo, string) {
	if p.Scope == "" {
		return nil, ""
	}
	si, ok := m.scopes.byName[p.Scope]
	if ok {
		return si, ""
	}
	if why, bad := m.scopes.invalid[p.Scope]; bad {
		return nil, fmt.Sprintf("scope %q is invalid (%s)", p.Scope, why)
	}
	return nil, fmt.Sprintf("scope %q does not exist in mesh %q", p.Scope, p.Mesh)
}

// buildType compiles a type partition from scratch.
func buildType(name string, m *meshState, list []*resource.Policy) *typeState {
	ts := &typeState{name: name, policies: pmap.New[string, *compiledPolicy](pmap.StringHash), epoch: &memoEpoch{}}
	// Policies compile independently: in chunks, concurrently.
	entries := make([]*compiledPolicy, len(list))
	const chunk = 256
	index.Parallel((len(list)+chunk-1)/chunk, func(c int) {
		for i := c * chunk; i < min(len(list), (c+1)*chunk); i++ {
			p := list[i]
			if si, why := m.scopeCheck(p); why != "" {
				entries[i] = &compiledPolicy{p: p, err: why}
			} else {
				entries[i] = compilePolicy(p, &m.settings, si)
			}
		}
	})
	for _, cp := range entries {
		if cp.err == "" {
			ts.counts.add(cp.p, 1)
		}
	}
	if ts.counts.mixed() {
		ts.conflicted = true
		resolveConflicts(entries)
	}
	// The indexes and the map of policies by name concurrently: the map
	// holds the entries and reads only their names.
	index.Parallel(2, func(i int) {
		if i == 0 {
			ts.index(m, entries)
			return
		}
		pb := ts.policies.Builder()
		for _, cp := range entries {
			pb.Set(cp.p.Name, cp)
		}
		ts.policies = pb.Map()
	})
	return ts
}

// index fills a freshly built partition's counts and indexes from its entries.
func (ts *typeState) index(m *meshState, entries []*compiledPolicy) {
	ts.scopeRules = make([]int32, m.scopes.size()+1)
	ts.audit.scopeRules = make([]int32, m.scopes.size()+1)
	var rs ruleSets
	ts.valid = formCounts{}
	ts.validAudit = formCounts{}
	ts.invalid = 0
	for _, cp := range entries {
		if cp.err != "" {
			ts.invalid++
			continue
		}
		ts.valid.add(cp.p, 1)
		if cp.audit() {
			ts.validAudit.add(cp.p, 1)
		}
		rs.add(cp, [2][]int32{ts.scopeRules, ts.audit.scopeRules}, 1)
	}
	// Under FirstMatch the first match of either action class decides: the
	// rule indexes' bitmaps hold both classes in one sequence (a Mesh that
	// changes the type's combine recompiles the mesh, hence these).
	build := index.Build
	if m.settings.forType(ts.name).combine != resource.DenyOverrides {
		build = index.BuildMerged
	}
	// Seven independent structures, each over rules of its own (an index
	// owns its rules' terms and sets their filed end): built concurrently.
	builds := [...]func(){
		func() { ts.rules = build(rs.rules[0], index.EndSrc|index.EndDst) },
		func() { ts.audit.rules = build(rs.rules[1], index.EndSrc|index.EndDst) },
		func() { ts.attachIn = index.Build(rs.in[0], index.EndDst) },
		func() { ts.attachOut = index.Build(rs.out[0], index.EndSrc) },
		func() { ts.audit.attachIn = index.Build(rs.in[1], index.EndDst) },
		func() { ts.audit.attachOut = index.Build(rs.out[1], index.EndSrc) },
		func() { ts.dest = updateDest(ts.dest, m, ts.name, nil, entries) },
	}
	index.Parallel(len(builds), func(i int) { builds[i]() })
}

func (cp *compiledPolicy) scopeOrd() int32 {
	if cp.scope == nil {
		return 0
	}
	return cp.scope.ord
}

// resolveConflicts marks the later-written offenders of a partition whose
// policies mix forms (docs/storage.md): the earliest-written policy's form stands.
func resolveConflicts(entries []*compiledPolicy) {
	var live []*compiledPolicy
	for _, cp := range entries {
		if cp.err == "" {
			live = append(live, cp)
		}
	}
	sort.Slice(live, func(i, j int) bool { return writtenBefore(live[i].p, live[j].p) })
	var first *compiledPolicy
	for _, cp := range live {
		if first == nil {
			first = cp
			continue
		}
		if cp.p.IsTargetRef() != first.p.IsTargetRef() {
			cp.err = fmt.Sprintf("mixes forms in type %s: it uses %s, but the earlier policy %q uses %s",
				cp.p.Type, formName(cp.p), first.p.Name, formName(first.p))
		}
	}
	var firstKind *compiledPolicy
	for _, cp := range live {
		if cp.err != "" || !(cp.p.HasItems() || cp.p.HasBlocks()) {
			continue
		}
		if firstKind == nil {
			firstKind = cp
			continue
		}
		if cp.p.HasItems() != firstKind.p.HasItems() {
			cp.err = fmt.Sprintf("mixes from/to items and defaults/overrides blocks in type %s: it has %s, but the earlier policy %q has %s",
				cp.p.Type, blockKind(cp.p), firstKind.p.Name, blockKind(firstKind.p))
		}
	}
}

func writtenBefore(a, b *resource.Policy) bool {
	if a.Meta.ModRevision != b.Meta.ModRevision {
		return a.Meta.ModRevision < b.Meta.ModRevision
	}
	return a.Name < b.Name
}

func formName(p *resource.Policy) string {
	if p.IsTargetRef() {
		return "targetRef"
	}
	return "sources/destinations"
}

func blockKind(p *resource.Policy) string {
	if p.HasItems() {
		return "from/to items"
	}
	return "defaults/overrides blocks"
}

// apply returns the partition after policy changes; nil when it holds none.
func (ts *typeState) apply(name string, m *meshState, changes []Change, check bool) *typeState {
	if ts == nil {
		var list []*resource.Policy
		for _, c := range changes {
			if p, ok := c.Resource.(*resource.Policy); ok {
				list = append(list, p)
			}
		}
		if len(list) == 0 {
			return nil
		}
		return buildType(name, m, list)
	}
	out := *ts
	out.epoch = &memoEpoch{}
	pb := ts.policies.Builder()
	var removed, added []*compiledPolicy
	for _, c := range changes {
		p, ok := c.Resource.(*resource.Policy)
		if old, had := pb.Get(c.Key.Name); had {
			removed = append(removed, old)
			if old.scopeValid(m) {
				out.counts.add(old.p, -1)
			}
			if !ok || p.Name != c.Key.Name {
				pb.Delete(c.Key.Name) // a put of the same name replaces it below: a Delete would copy the path twice
			}
		}
		if !ok {
			continue
		}
		si, why := m.scopeCheck(p)
		var cp *compiledPolicy
		if why != "" {
			cp = &compiledPolicy{p: p, err: why}
		} else {
			cp = compilePolicy(p, &m.settings, si)
			out.counts.add(p, 1)
		}
		added = append(added, cp)
		pb.Set(p.Name, cp)
	}
	out.policies = pb.Map()
	if out.policies.Len() == 0 {
		return nil
	}
	if ts.conflicted || out.counts.mixed() {
		// The validity of other policies may change: recompile the partition.
		// (Rules are never shared between two indexes: an index owns its rules' terms.)
		var list []*resource.Policy
		out.policies.Range(func(_ string, cp *compiledPolicy) bool {
			list = append(list, cp.p)
			return true
		})
		return buildType(name, m, list)
	}
	var gone, added2 ruleSets
	// Both counts' copies in one array: neither is written after this.
	srs := make([]int32, len(ts.scopeRules)+len(ts.audit.scopeRules))
	na := copy(srs, ts.scopeRules)
	copy(srs[na:], ts.audit.scopeRules)
	sr := [2][]int32{srs[:na:na], srs[na:]}
	for _, cp := range removed {
		if cp.err != "" {
			out.invalid--
			continue
		}
		out.valid.add(cp.p, -1)
		if cp.audit() {
			out.validAudit.add(cp.p, -1)
		}
		gone.add(cp, sr, -1)
	}
	for _, cp := range added {
		if cp.err != "" {
			out.invalid++
			continue
		}
		out.valid.add(cp.p, 1)
		if cp.audit() {
			out.validAudit.add(cp.p, 1)
		}
		added2.add(cp, sr, 1)
	}
	out.scopeRules, out.audit.scopeRules = sr[0], sr[1]
	if check {
		// Validity is settled above; the indexes (rules, attachments,
		// PerDestination claims) are half of a policy write's cost and a
		// check reads none of them.
		return &out
	}
	out.rules = ts.rules.Update(gone.rules[0], added2.rules[0])
	out.attachIn = ts.attachIn.Update(gone.in[0], added2.in[0])
	out.attachOut = ts.attachOut.Update(gone.out[0], added2.out[0])
	out.audit.rules = ts.audit.rules.Update(gone.rules[1], added2.rules[1])
	out.audit.attachIn = ts.audit.attachIn.Update(gone.in[1], added2.in[1])
	out.audit.attachOut = ts.audit.attachOut.Update(gone.out[1], added2.out[1])
	out.dest = updateDest(ts.dest, m, name, removed, added)
	return &out
}

// scopeValid reports whether the policy's scope reference holds in m (an entry
// can be invalid for its scope or for a form conflict).
func (cp *compiledPolicy) scopeValid(m *meshState) bool {
	_, why := m.scopeCheck(cp.p)
	return why == ""
}

// Digest is SHA-256 over every key and its stored value, sorted by key: the hex
// SHA-256 of the concatenation, in key byte order, of
// key + " " + hex(SHA-256(value)) + "\n", where key is the path without prefix.
// Equal digests on two replicas mean equal contents (PolicyService.Status). The
// value hash is Meta.ValueHash, set by the store from the stored bytes; a
// resource without one (offline) counts with its canonical encoding, and a
// broken value with its bytes.
func (s *Snapshot) Digest() string {
	type kv struct {
		path string
		h    [32]byte
	}
	entries := make([]kv, 0, s.Len())
	s.Resources(func(e Entry) bool {
		h := e.Resource.Metadata().ValueHash
		if h == ([32]byte{}) {
			if b, err := resource.EncodeJSON(e.Resource); err == nil {
				h = sha256.Sum256(b)
			}
		}
		entries = append(entries, kv{e.Resource.Key().String(), h})
		return true
	})
	s.broken.Range(func(p string, b *InvalidResource) bool {
		entries = append(entries, kv{p, sha256.Sum256(b.Value)})
		return true
	})
	sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	d := sha256.New()
	for _, e := range entries {
		d.Write([]byte(e.path))
		d.Write([]byte{' '})
		d.Write([]byte(hex.EncodeToString(e.h[:])))
		d.Write([]byte{'\n'})
	}
	return hex.EncodeToString(d.Sum(nil))
}

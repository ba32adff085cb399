package engine

// The bridge engine/analysis stands on (docs/analysis.md, docs/lint.md): a
// read-only view of one (mesh, type) of a snapshot — its rules in order, its
// scopes and their membership, its settings and its policies as compiled —
// and an entry into the decision procedure that a caller who already knows
// which rules match a flow can narrow (Prefilter). Nothing here changes a
// snapshot; every value handed out is shared and must not be modified.

import (
	"iter"
	"slices"
	"sync"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Partition is a read-only view of one mesh and type of a snapshot: what
// Decide reads to answer a flow of them. It holds the snapshot: the view
// stays valid and unchanged as long as it is held.
type Partition struct {
	s      *Snapshot
	ms     *meshState // nil: a closed partition of a mesh with no decodable resource
	ts     *typeState // nil: the type has no policy
	mesh   string
	typ    string
	set    typeSettings
	closed bool
}

// Partition returns the view of mesh ("" = default) and typ ("" =
// TrafficPermission). It fails as Decide does: ErrMeshNotFound for a mesh
// that holds no resource, ErrTypeNotFound (an *UnknownTypeError) for a type
// the mesh does not know. A partition closed by an invalid stored resource
// is returned (Closed): every flow of it is denied.
func (s *Snapshot) Partition(mesh, typ string) (*Partition, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(mesh)
	p := &Partition{s: s, ms: ms, mesh: mesh, typ: typ}
	if ok {
		p.ts, _ = ms.types.Get(typ)
		p.set = ms.settings.forType(typ)
	} else {
		st := settingsOf(nil)
		p.set = st.forType(typ)
	}
	if s.closedByType(mesh, ms, typ) != nil {
		p.closed = true
		return p, nil
	}
	if !ok {
		return nil, errNoMesh(mesh)
	}
	if err := ms.checkType(typ); err != nil {
		return nil, err
	}
	return p, nil
}

// Mesh names the partition's mesh.
func (p *Partition) Mesh() string { return p.mesh }

// Type names the partition's type.
func (p *Partition) Type() string { return p.typ }

// Revision is the revision of the partition's snapshot.
func (p *Partition) Revision() int64 { return p.s.revision }

// Snapshot is the snapshot the partition is a view of.
func (p *Partition) Snapshot() *Snapshot { return p.s }

// Closed reports whether an invalid stored resource closes the partition
// (docs/storage.md): Decide denies every flow of it with reason
// INVALID_RESOURCE.
func (p *Partition) Closed() bool { return p.closed }

// Settings are the settings that apply to one policy type (docs/order.md),
// every default resolved.
type Settings struct {
	Combine          resource.Combine
	DefaultAction    resource.Action
	UnenforcedAction resource.Action
	// PerDestination: select PerDestination chooses one policy per inbound
	// (docs/kuma.md).
	PerDestination bool
}

// Settings returns the partition's settings.
func (p *Partition) Settings() Settings {
	return Settings{Combine: p.set.combine, DefaultAction: p.set.defaultAction, UnenforcedAction: p.set.unenforcedAction,
		PerDestination: p.set.perDestination}
}

// Rules returns the index of the partition's enforced rules (audit false) or
// of its audit rules (docs/audit.md); nil when the type has no policy. Its
// rules in index.OrderKey order are the one rule order of docs/order.md;
// catch-alls are not in it (CatchAlls).
func (p *Partition) Rules(audit bool) *index.Index {
	if p.ts == nil {
		return nil
	}
	if audit {
		return p.ts.audit.rules
	}
	return p.ts.rules
}

// NotApplicable reports whether no enforced policy of the type can ever be a
// candidate on a side (0 outbound, 1 inbound): the side is NOT_APPLICABLE
// (docs/order.md).
func (p *Partition) NotApplicable(side int) bool { return p.ts.notApplicable(side, false) }

// PolicyCounts count the valid policies the enforced decision sees.
type PolicyCounts struct {
	Policies int // every one
	SD       int // those of the sources & destinations form
}

// Counts returns the counts of the partition's enforced valid policies.
func (p *Partition) Counts() PolicyCounts {
	if p.ts == nil {
		return PolicyCounts{}
	}
	c := p.ts.enforcedCounts()
	return PolicyCounts{Policies: c.policies, SD: c.sd}
}

// ScopeRules returns, per scope ord ([0]: the mesh root), how many valid
// enforced rules of sources & destinations policies the scope holds; nil
// when the type has no policy. Shared: do not modify.
func (p *Partition) ScopeRules() []int32 {
	if p.ts == nil {
		return nil
	}
	return p.ts.scopeRules
}

// PolicyView is one policy of a partition as compiled.
type PolicyView struct {
	Doc *resource.Policy
	// Err says why the policy is invalid in its mesh; "" when valid. An
	// invalid policy has no rules.
	Err string
	// Audit: the policy is in audit mode, its own or its scope's; every rule
	// of it is an audit rule.
	Audit bool
	// Rules are its rules, in the order of its document; Attach, for a
	// targetRef policy, one pseudo-rule per side it has items on, matching
	// the workloads its targetRef selects on that side. Shared.
	Rules  []*index.Rule
	Attach []*index.Rule
}

func viewOf(cp *compiledPolicy) PolicyView {
	return PolicyView{Doc: cp.p, Err: cp.err, Audit: cp.audit(), Rules: cp.rules, Attach: cp.attach}
}

// Policy returns the policy of the partition named name, valid or not.
func (p *Partition) Policy(name string) (PolicyView, bool) {
	if p.ts == nil {
		return PolicyView{}, false
	}
	cp, ok := p.ts.policies.Get(name)
	if !ok {
		return PolicyView{}, false
	}
	return viewOf(cp), true
}

// Policies yields every policy of the partition, valid or not, in no
// particular order.
func (p *Partition) Policies() iter.Seq[PolicyView] {
	return func(yield func(PolicyView) bool) {
		if p.ts == nil {
			return
		}
		p.ts.policies.Range(func(_ string, cp *compiledPolicy) bool { return yield(viewOf(cp)) })
	}
}

// ScopeView is one valid scope of the partition's mesh.
type ScopeView struct {
	Doc *resource.Scope
	// Ord is the scope's place in the total scope order, from 1 (the mesh
	// root is 0); a rule's Scope is an ord. Parent is the parent's ord (0:
	// none); Ancestors every ancestor's, nearest first (shared).
	Ord       int32
	Parent    int32
	Ancestors []int32
	// Audit: the scope is in audit mode, its own or an ancestor's: the
	// enforced decision leaves it and its children out (docs/audit.md).
	Audit bool
}

// Scopes returns the valid scopes of the mesh in their order:
// Scopes()[ord-1] is the scope at ord.
func (p *Partition) Scopes() []ScopeView {
	if p.ms == nil {
		return nil
	}
	out := make([]ScopeView, len(p.ms.scopes.list))
	for i, si := range p.ms.scopes.list {
		out[i] = ScopeView{Doc: si.doc, Ord: si.ord, Parent: si.parent, Ancestors: si.ancestors, Audit: si.audit}
	}
	return out
}

// MemberOf reports whether a workload with tags is a member of the scope at
// ord (docs/order.md): its own selectors match, and every ancestor's. Every
// workload is a member of the mesh root (ord 0).
func (p *Partition) MemberOf(ord int32, tags resource.Tags) bool { return p.ms.memberOf(ord, tags) }

// memberOf reports whether tags are a member of the scope at ord: its own
// selectors match, and every ancestor's.
func (ms *meshState) memberOf(ord int32, tags resource.Tags) bool {
	if ord == 0 {
		return true
	}
	si := ms.scopes.list[ord-1]
	if !si.holds(tags) {
		return false
	}
	for _, a := range si.ancestors {
		if !ms.scopes.list[a-1].holds(tags) {
			return false
		}
	}
	return true
}

// holds reports whether one of the scope's own selectors matches tags.
func (si *scopeInfo) holds(tags resource.Tags) bool {
	for _, m := range si.selectors {
		if m.Matches(tags) {
			return true
		}
	}
	return false
}

// ScopeName names the scope at ord; "" for the mesh root.
func (p *Partition) ScopeName(ord int32) string { return p.ms.scopeName(ord) }

// CatchAlls returns the catch-alls of the type, in the order a side with no
// matching rule tries them (the lowest-priority member scope first); audit
// ones included (index.Rule.Audit). Shared.
func (p *Partition) CatchAlls() []*index.Rule {
	if p.ms == nil {
		return nil
	}
	return p.ms.scopes.catchAlls[p.typ]
}

// Inventory returns the workloads of the partition's mesh; nil for none.
func (p *Partition) Inventory() *inventory.Inventory {
	if p.ms == nil {
		return nil
	}
	return p.ms.inv
}

// SameShape reports whether two versions of a partition (of one mesh and
// type, on two snapshots) agree on what every flow's answer depends on
// besides the rules that match it: which sides can have candidates at all
// (not-applicable sides), in the enforced and the shadow view; the invalid
// policies; audit; which scopes (the mesh root included) hold rules; and
// neither chooses per destination. When they do, a flow that no changed rule
// or attachment matches keeps its answer (Impact's premise).
func (p *Partition) SameShape(q *Partition) bool {
	a, b := p.ts, q.ts
	if a == nil || b == nil || p.set.perDestination || q.set.perDestination {
		return false
	}
	shape := func(ts *typeState, shadow bool) [4]bool {
		c := ts.viewCounts(shadow)
		return [4]bool{c.policies > 0, c.sd > 0, c.from > 0, c.to > 0}
	}
	if shape(a, false) != shape(b, false) || shape(a, true) != shape(b, true) || a.invalid != b.invalid ||
		a.conflicted || b.conflicted || a.audited() != b.audited() ||
		len(a.scopeRules) != len(b.scopeRules) || len(a.audit.scopeRules) != len(b.audit.scopeRules) {
		return false
	}
	for i := range a.scopeRules {
		if (a.scopeRules[i] > 0) != (b.scopeRules[i] > 0) {
			return false
		}
	}
	for i := range a.audit.scopeRules {
		if (a.audit.scopeRules[i] > 0) != (b.audit.scopeRules[i] > 0) {
			return false
		}
	}
	return true
}

// Prefilter narrows a decision's scan to the rules that match its flow, for
// a caller that finds them its own way (engine/analysis: bitmaps of the
// rules each end of a flow satisfies, kept across many flows).
type Prefilter interface {
	// Matching hands pick, in the order of their keys (index.OrderKey.Less),
	// the rules of ix that match the flow — both ends' selectors, the
	// protocol and the port — of one action class: actions 1, the DENY
	// rules; -1, the ALLOW rules; 0, both. Every such rule must be handed
	// until Take returns false; no rule that does not match may be. It
	// returns false, having handed nothing, when it does not cover ix: the
	// decision then scans ix itself.
	Matching(ix *index.Index, actions int, pick *Pick) bool
}

// Pick takes a scan's matching rules in order and keeps, per side still
// open, the first that is a candidate there (its side and its scope hold
// the side's workload) and comes before the rule already kept.
type Pick struct {
	sc   *index.Scratch
	open [2]bool
	best [2]*index.Rule
}

// Take offers the next matching rule; it reports whether more are wanted.
func (pk *Pick) Take(r *index.Rule) bool {
	for side := 0; side < 2; side++ {
		if !pk.open[side] {
			continue
		}
		if pk.best[side] != nil && !r.Key.Less(&pk.best[side].Key) {
			pk.open[side] = false
			continue
		}
		if r.Sides&index.SideBits[side] != 0 && pk.sc.IsMember(side, r.Scope) {
			pk.best[side], pk.open[side] = r, false
		}
	}
	return pk.open[0] || pk.open[1]
}

// scanPrefiltered is scanRules by the rules pre hands: index.ScanFirstMatch
// or index.ScanDenyOverrides by their definition. It returns false when pre
// does not cover ix.
func scanPrefiltered(pre Prefilter, ix *index.Index, combine resource.Combine, sc *scratch, need [2]bool, p *picks) bool {
	if combine != resource.DenyOverrides {
		return pickFirst(pre, ix, 0, sc, need, &p.first)
	}
	if !pickFirst(pre, ix, 1, sc, need, &p.deny) {
		return false
	}
	for side := 0; side < 2; side++ {
		need[side] = need[side] && p.deny[side] == nil
	}
	if need[0] || need[1] {
		pickFirst(pre, ix, -1, sc, need, &p.allow)
	}
	for side := 0; side < 2; side++ {
		p.first[side] = p.deny[side]
		if p.first[side] == nil {
			p.first[side] = p.allow[side]
		}
	}
	return true
}

func pickFirst(pre Prefilter, ix *index.Index, actions int, sc *scratch, need [2]bool, best *[2]*index.Rule) bool {
	pk := &sc.pick
	pk.sc, pk.open, pk.best = &sc.Scratch, need, *best
	if !pre.Matching(ix, actions, pk) {
		return false
	}
	*best = pk.best
	return true
}

// Decide decides a flow between two tag sets into d, as Decide does for a
// request of the tag form without the memo: every field but the
// resolutions and Explain, which it leaves zero. pre, when not nil, hands
// the scan the rules that match the flow (Prefilter). A closed partition
// denies the flow.
func (p *Partition) Decide(f *index.Flow, pre Prefilter, d *Decision) {
	if p.closed {
		*d = closedDecision(p.s.revision, false)
		return
	}
	*d = Decision{}
	sc := scratchPool.Get().(*scratch)
	sc.Procedure = 0
	sc.pre = pre
	p.ms.decide(p.typ, f, sc, d)
	sc.pre = nil
	scratchPool.Put(sc)
	d.Revision = p.s.revision
}

// Pair decides flows between two fixed ends that differ only by protocol
// and port: the scopes each end is a member of are found once. It is not
// safe for concurrent use; Release returns its memory.
type Pair struct {
	p  *Partition
	sc *scratch
	f  index.Flow
}

// Pair returns the decider of the flows from src to dst (tags, shared: not
// modified).
func (p *Partition) Pair(src, dst resource.Tags) Pair {
	pr := Pair{p: p, f: index.Flow{Src: src, Dst: dst}}
	if p.closed {
		return pr
	}
	sc := scratchPool.Get().(*scratch)
	sc.Procedure = 0
	n := p.ms.scopes.size()
	sc.reset(n)
	if n > 0 {
		sc.computeMembers(p.ms.scopes, 0, src)
		sc.computeMembers(p.ms.scopes, 1, dst)
	}
	pr.sc = sc
	return pr
}

// Decide decides the pair's flow on a protocol and port into d, as
// Partition.Decide does.
func (pr *Pair) Decide(proto resource.Protocol, port uint32, pre Prefilter, d *Decision) {
	p := pr.p
	if p.closed {
		*d = closedDecision(p.s.revision, false)
		return
	}
	pr.f.Proto, pr.f.Port = proto, port
	*d = Decision{}
	sc, ms := pr.sc, p.ms
	sc.pre = pre
	var found picks
	ms.decideView(p.ts, p.typ, p.set, &pr.f, sc, false, &found, d)
	if ms.scopes.audit || p.ts.audited() {
		ms.decideShadow(p.ts, p.typ, p.set, &pr.f, sc, &found, d)
	}
	sc.pre = nil
	d.Revision = p.s.revision
}

// Release returns the pair's memory; the pair is not used after.
func (pr *Pair) Release() {
	if pr.sc != nil {
		scratchPool.Put(pr.sc)
		pr.sc = nil
	}
}

// Meshes returns the names of the meshes that hold a resource, sorted.
func (s *Snapshot) Meshes() []string {
	out := make([]string, 0, s.meshes.Len())
	s.meshes.Range(func(name string, _ *meshState) bool {
		out = append(out, name)
		return true
	})
	slices.Sort(out)
	return out
}

// KnownTypes returns the types of a mesh that have policies or that its Mesh
// or scopes name, sorted; nil for a mesh that holds no resource.
func (s *Snapshot) KnownTypes(mesh string) []string {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, ok := s.meshes.Get(mesh)
	if !ok {
		return nil
	}
	return ms.knownTypes()
}

// knownTypes lists the types of the mesh that have policies or are named by
// its Mesh or scopes.
func (ms *meshState) knownTypes() []string {
	var out []string
	ms.types.Range(func(t string, _ *typeState) bool {
		out = append(out, t)
		return true
	})
	for t := range ms.declared {
		out = append(out, t)
	}
	if ms.scopes != nil {
		for t := range ms.scopes.catchAlls {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Inventory returns the workloads of a mesh ("" = default); nil for none.
func (s *Snapshot) Inventory(mesh string) *inventory.Inventory { return s.inventoryOf(mesh) }

// EndpointTags is ResolveEndpoint without the identity: the tags a flow with
// the endpoint is decided on, and ResolveEndpoint's errors. It spares the
// hash an identity computed from tags costs, for callers that resolve many
// endpoints and read only their tags.
func (s *Snapshot) EndpointTags(mesh string, ep *inventory.Endpoint, destination bool, port uint32, reg *inventory.Registry) (resource.Tags, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, _ := s.meshes.Get(mesh)
	r, err := resolveEndpoint(ms, mesh, ep, destination, port, reg, false)
	return r.Tags, err
}

// Preview returns the snapshot a write would make and the change set it
// applies, writing nothing: the write is validated as CheckApply validates
// it (its error is CheckApply's), stamped at the next revision as the store
// would stamp it, and applied to a copy (Apply). The preview answers like
// any snapshot; it is never served (its lineage reads s's without writing
// to it: Carried).
func (s *Snapshot) Preview(puts []resource.Resource, deletes []resource.Key) (*Snapshot, []Change, error) {
	changes, err := s.checkApply(puts, deletes)
	if err != nil {
		return nil, nil, err
	}
	out := s.Apply(s.revision+1, slices.Clone(changes))
	out.lineage = &lineage{parent: s.lineage}
	return out, changes, nil
}

// attachment is a value attached to a snapshot, built once.
type attachment struct {
	once sync.Once
	v    any
}

// Attached returns the value the snapshot holds under key, built by build on
// the first call for the key: concurrent first calls build it once, the
// others wait for it. The values die with the snapshot — the snapshots
// Apply makes start without them — so a value computed from one snapshot
// never answers for another revision. Keys compare as map keys: a package
// uses a key type of its own.
func (s *Snapshot) Attached(key any, build func() any) any {
	v, _ := s.attached.LoadOrStore(key, &attachment{})
	a := v.(*attachment)
	a.once.Do(func() { a.v = build() })
	return a.v
}

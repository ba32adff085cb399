package engine

// Bulk evaluation (docs/analysis.md): many flows of one mesh and type decided
// against one snapshot, the work they share done once. Reach, Matrix and
// Impact stand on it.
//
// Two reductions, both exact:
//
//   - Tag classes. A decision reads a workload's tags only through the
//     conditions of the selectors of the mesh's scopes and of the type's
//     policies: which keys are present, which values are named (match, In,
//     NotIn), which prefixes and CIDRs a value falls under. Two tag sets that
//     agree on every such condition are decided alike. Intern projects a tag
//     set onto the keys some selector mentions and replaces each value no
//     selector names by the first value seen with the same prefixes and CIDRs:
//     a class. Replicas of one deployment, instances that differ only by a
//     name no policy names, fall into one class and are decided once.
//   - Fixed ends. When many flows share one end (a class, a protocol and a
//     port), the rules whose selector on that end matches it, and whose ports
//     match, are filtered once, in order (fixedCands); each flow then walks
//     that short list for the other end. The walk is the scan's own
//     definition — the first candidate rule in order that matches, per side —
//     so the answer is the one Decide gives; everything else (scopes,
//     catch-alls, fallbacks, audit, PerDestination) is the decision procedure
//     itself.

import (
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Bulk decides flows of one mesh and type against one snapshot. It is not
// safe for concurrent use; its answers are shared (do not modify them).
type Bulk struct {
	s         *Snapshot
	ms        *meshState
	ts        *typeState
	mesh, typ string
	closed    bool // an invalid stored resource closes the partition
	conds     map[string]*keyConds
	classes   map[string]int32
	tags      []resource.Tags // per class, the tags it is decided on
	answers   map[bulkKey]*Decision
	uses      map[fixedKey]int32
	fixed     map[fixedKey]*fixedCands
	sorted    [2][]*index.Rule // every enforced and audit rule, in order; built on first need
	sortedOK  bool
	decisions int // decisions made (distinct class pairs and flows)
	// the outside classes (outside.go), computed on first need
	outside      []outsideClass
	outsideNotes []string
}

// ClassID names a tag class of a Bulk.
type ClassID int32

type bulkKey struct {
	src, dst ClassID
	proto    resource.Protocol
	port     uint32
}

// fixedKey is one end of many flows: the side (0 source, 1 destination), its
// class, protocol and port.
type fixedKey struct {
	end   uint8
	class ClassID
	proto resource.Protocol
	port  uint32
}

// fixedAfter is how many decisions one end takes before its rules are
// filtered once for the rest: a filter reads every rule of the type, a
// decision a few lists.
const fixedAfter = 48

// fixedAfterOverride, when positive, replaces fixedAfter (the tests force
// the fixed-end walk with 1).
var fixedAfterOverride atomic.Int32

// Bulk returns a bulk evaluator of mesh ("" = default) and typ (""
// = TrafficPermission). It fails as Decide does: ErrMeshNotFound for a mesh
// that holds no resource, ErrTypeNotFound for a type the mesh does not know.
func (s *Snapshot) Bulk(mesh, typ string) (*Bulk, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(mesh)
	b := &Bulk{s: s, ms: ms, mesh: mesh, typ: typ, classes: map[string]int32{},
		answers: map[bulkKey]*Decision{}, uses: map[fixedKey]int32{}, fixed: map[fixedKey]*fixedCands{}}
	if s.closedByType(mesh, ms, typ) != nil {
		b.closed = true
		return b, nil
	}
	if !ok {
		return nil, errNoMesh(mesh)
	}
	if err := ms.checkType(typ); err != nil {
		return nil, err
	}
	b.ts, _ = ms.types.Get(typ)
	b.conds = conditionsOf(ms, b.ts)
	return b, nil
}

// Mesh and Type name the partition.
func (b *Bulk) Mesh() string { return b.mesh }

// Type names the partition's type.
func (b *Bulk) Type() string { return b.typ }

// Decisions is the number of decisions made so far: one per distinct
// (class, class, protocol, port).
func (b *Bulk) Decisions() int { return b.decisions }

// Intern returns the class of a tag set: equal for every tag set decided
// alike by the reductions above.
func (b *Bulk) Intern(tags resource.Tags) ClassID {
	var kb [16]string
	keys := kb[:0]
	for k := range tags {
		if _, ok := b.conds[k]; ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var sb strings.Builder
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = b.conds[k].canonical(tags[k])
		sb.WriteString(k)
		sb.WriteByte(0)
		sb.WriteString(vals[i])
		sb.WriteByte(0)
	}
	key := sb.String()
	if id, ok := b.classes[key]; ok {
		return ClassID(id)
	}
	t := make(resource.Tags, len(keys))
	for i, k := range keys {
		t[k] = vals[i]
	}
	id := int32(len(b.tags))
	b.tags = append(b.tags, t)
	b.classes[key] = id
	return ClassID(id)
}

// Tags returns the tags a class is decided on (shared: do not modify).
func (b *Bulk) Tags(c ClassID) resource.Tags { return b.tags[c] }

// Decide answers the flow from class src to class dst, deciding it once per
// distinct (src, dst, proto, port). The answer is Decide's for any flow
// between tag sets of those classes (its resolutions aside); it is shared.
func (b *Bulk) Decide(src, dst ClassID, proto resource.Protocol, port uint32) *Decision {
	k := bulkKey{src, dst, proto, port}
	if d, ok := b.answers[k]; ok {
		return d
	}
	d := &Decision{}
	b.decisions++
	if b.closed {
		*d = closedDecision(b.s.revision, false)
		b.answers[k] = d
		return d
	}
	fc := b.fixedFor(fixedKey{0, src, proto, port}, fixedKey{1, dst, proto, port})
	f := index.Flow{Src: b.tags[src], Dst: b.tags[dst], Proto: proto, Port: port}
	sc := scratchPool.Get().(*scratch)
	sc.fixed = fc
	b.ms.decide(b.typ, &f, sc, d)
	sc.fixed = nil
	scratchPool.Put(sc)
	d.Revision = b.s.revision
	b.answers[k] = d
	return d
}

// fixedFor returns the fixed-end candidates for a flow, when one of its ends
// has been decided often enough to be worth filtering for.
func (b *Bulk) fixedFor(ends ...fixedKey) *fixedCands {
	if b.ts == nil || b.ts.rules.Size+b.ts.audit.rules.Size == 0 {
		return nil
	}
	for _, k := range ends {
		if fc, ok := b.fixed[k]; ok {
			return fc
		}
	}
	for _, k := range ends {
		n := b.uses[k] + 1
		b.uses[k] = n
		if limit := fixedAfterOverride.Load(); n >= fixedAfter || limit > 0 && n >= limit {
			fc := b.buildFixed(k)
			b.fixed[k] = fc
			delete(b.uses, k)
			return fc
		}
	}
	return nil
}

// buildFixed filters, in order, the rules that can match flows with end k.
func (b *Bulk) buildFixed(k fixedKey) *fixedCands {
	if !b.sortedOK {
		for i, ix := range [2]*index.Index{b.ts.rules, b.ts.audit.rules} {
			var all []*index.Rule
			ix.Each(func(r *index.Rule) { all = append(all, r) })
			slices.SortFunc(all, func(x, y *index.Rule) int {
				if x.Key.Less(&y.Key) {
					return -1
				}
				if y.Key.Less(&x.Key) {
					return 1
				}
				return 0
			})
			b.sorted[i] = all
		}
		b.sortedOK = true
	}
	tags := b.tags[k.class]
	fc := &fixedCands{end: k.end}
	for i, ix := range [2]*index.Index{b.ts.rules, b.ts.audit.rules} {
		l := &fc.lists[i]
		l.ix = ix
		for _, r := range b.sorted[i] {
			m := r.Src
			if k.end == 1 {
				m = r.Dst
			}
			if !index.MatchesPorts(r.Ports, k.proto, k.port) || !matcherHolds(m, tags) {
				continue
			}
			l.all = append(l.all, r)
			if r.Action == resource.Deny {
				l.deny = append(l.deny, r)
			} else {
				l.allow = append(l.allow, r)
			}
		}
	}
	return fc
}

func matcherHolds(m *index.Matcher, tags resource.Tags) bool { return m == nil || m.Matches(tags) }

// fixedCands are the rules that can match flows with one fixed end, per rule
// index of the partition (enforced, audit), in order.
type fixedCands struct {
	end   uint8 // 0: the source is fixed; 1: the destination
	lists [2]fixedList
}

type fixedList struct {
	ix               *index.Index
	all, deny, allow []*index.Rule
}

// list returns the filtered list of ix, or nil when ix is not one of them.
func (fc *fixedCands) list(ix *index.Index) *fixedList {
	if fc == nil {
		return nil
	}
	for i := range fc.lists {
		if fc.lists[i].ix == ix {
			return &fc.lists[i]
		}
	}
	return nil
}

// scan is scanRules over the filtered list: index.ScanFirstMatch or
// index.ScanDenyOverrides, by their definition.
func (l *fixedList) scan(end uint8, combine resource.Combine, f *index.Flow, sc *scratch, need [2]bool, p *picks) {
	if combine == resource.DenyOverrides {
		improve(l.deny, end, f, sc, need, &p.deny)
		for side := 0; side < 2; side++ {
			need[side] = need[side] && p.deny[side] == nil
		}
		if need[0] || need[1] {
			improve(l.allow, end, f, sc, need, &p.allow)
		}
		for side := 0; side < 2; side++ {
			p.first[side] = p.deny[side]
			if p.first[side] == nil {
				p.first[side] = p.allow[side]
			}
		}
		return
	}
	improve(l.all, end, f, sc, need, &p.first)
}

// improve sets best[side], for each side in need, to the first rule of rules
// (in order) that comes before it, is a candidate on the side and matches the
// flow's other end. rules match the fixed end and the ports already.
func improve(rules []*index.Rule, end uint8, f *index.Flow, sc *scratch, need [2]bool, best *[2]*index.Rule) {
	open := need
	for _, r := range rules {
		var cand [2]bool
		for side := 0; side < 2; side++ {
			if !open[side] {
				continue
			}
			if best[side] != nil && !r.Key.Less(&best[side].Key) {
				open[side] = false
				continue
			}
			cand[side] = r.Sides&index.SideBits[side] != 0 && sc.IsMember(side, r.Scope)
		}
		if !open[0] && !open[1] {
			return
		}
		if !cand[0] && !cand[1] {
			continue
		}
		if end == 0 && !matcherHolds(r.Dst, f.Dst) || end == 1 && !matcherHolds(r.Src, f.Src) {
			continue
		}
		for side := 0; side < 2; side++ {
			if cand[side] {
				best[side] = r
				open[side] = false
			}
		}
	}
}

// keyConds are the conditions the selectors of a partition put on one tag
// key: the values they name, the prefixes and CIDRs they test. A value none
// names is decided as any other with the same prefixes and CIDRs.
type keyConds struct {
	named    map[string]bool
	prefixes []string
	cidrs    []netip.Prefix
	reps     map[string]string // signature → the first value seen with it
	memo     map[string]string // value → its canonical value
}

// canonical returns the value a class holds for v.
func (c *keyConds) canonical(v string) string {
	if c.named[v] {
		return v
	}
	if out, ok := c.memo[v]; ok {
		return out
	}
	sig := c.signature(v)
	rep, ok := c.reps[sig]
	if !ok {
		rep = v
		c.reps[sig] = v
	}
	c.memo[v] = rep
	return rep
}

// signature is which prefixes and CIDRs v falls under, as text.
func (c *keyConds) signature(v string) string {
	buf := make([]byte, 0, len(c.prefixes)+len(c.cidrs))
	for _, p := range c.prefixes {
		buf = append(buf, boolByte(strings.HasPrefix(v, p)))
	}
	a, err := netip.ParseAddr(v)
	for _, p := range c.cidrs {
		buf = append(buf, boolByte(err == nil && p.Contains(a.Unmap())))
	}
	return string(buf)
}

func boolByte(b bool) byte {
	if b {
		return '1'
	}
	return '0'
}

// conditionsOf collects, per tag key, the conditions of every selector the
// decisions of a partition read: the mesh's scopes and the type's policies
// (sources, destinations, targetRefs, items).
func conditionsOf(ms *meshState, ts *typeState) map[string]*keyConds {
	out := map[string]*keyConds{}
	add := func(s *resource.Selector) {
		if s == nil {
			return
		}
		for k, v := range s.Match {
			c := condsFor(out, k)
			if v != "*" {
				c.named[v] = true
			}
		}
		for _, e := range s.Expressions {
			c := condsFor(out, e.Key)
			switch e.Operator {
			case resource.OpIn, resource.OpNotIn:
				for _, v := range e.Values {
					c.named[v] = true
				}
			case resource.OpPrefix:
				c.prefixes = append(c.prefixes, e.Values...)
			case resource.OpCIDR:
				for _, v := range e.Values {
					if p, err := resource.ParseCIDR(v); err == nil {
						c.cidrs = append(c.cidrs, p)
					}
				}
			}
		}
	}
	ms.scopeDocs.Range(func(_ string, s *resource.Scope) bool {
		for i := range s.Selectors {
			add(&s.Selectors[i])
		}
		return true
	})
	if ts != nil {
		ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
			for _, s := range policySelectors(cp.p) {
				add(s)
			}
			return true
		})
	}
	return out
}

// policySelectors lists every selector of a policy: sources, destinations,
// its targetRef and its items' targetRefs.
func policySelectors(p *resource.Policy) []*resource.Selector {
	var out []*resource.Selector
	for i := range p.Sources {
		out = append(out, &p.Sources[i])
	}
	for i := range p.Destinations {
		out = append(out, &p.Destinations[i])
	}
	if p.TargetRef != nil {
		out = append(out, resource.TargetSelector(*p.TargetRef))
	}
	for _, items := range [][]resource.Item{p.From, p.To} {
		for i := range items {
			out = append(out, resource.TargetSelector(items[i].TargetRef))
		}
	}
	return out
}

func condsFor(m map[string]*keyConds, k string) *keyConds {
	c, ok := m[k]
	if !ok {
		c = &keyConds{named: map[string]bool{}, reps: map[string]string{}, memo: map[string]string{}}
		m[k] = c
	}
	return c
}

package conditions

// The conditions themselves, the answer per partition, and the Tracker that
// carries them from one snapshot to the next (docs/lint.md, "Standing
// conditions").

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Kind names one standing condition.
type Kind uint8

// The conditions (docs/lint.md). A valid policy is Accepted, an invalid one
// Invalid; an accepted enforced policy holds one of Enforced,
// PartiallyEnforced, Overridden and Shadowed, unless an invalid stored
// resource closes its mesh and type (then none); an audit policy holds
// Audit instead; NoWorkloads comes beside them.
const (
	Accepted Kind = iota + 1
	Invalid
	Enforced
	PartiallyEnforced
	Overridden
	Shadowed
	Audit
	NoWorkloads
)

var kindNames = [...]string{"", "Accepted", "Invalid", "Enforced", "PartiallyEnforced", "Overridden", "Shadowed", "Audit", "NoWorkloads"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return ""
}

// Kinds lists every condition, in order: the metric's whole label set.
func Kinds() []Kind {
	out := make([]Kind, 0, len(kindNames)-1)
	for k := Accepted; int(k) < len(kindNames); k++ {
		out = append(out, k)
	}
	return out
}

// Condition is one condition a policy holds, and why.
type Condition struct {
	Kind    Kind
	Message string
}

// Partition is the conditions of every policy of one (mesh, type) at one
// revision. It is immutable.
type Partition struct {
	Mesh, Type string
	Revision   int64
	st         *state
}

// Policy returns the conditions of the named policy, in Kind order; false
// when the partition holds no such policy.
func (p *Partition) Policy(name string) ([]Condition, bool) {
	ps, ok := p.st.policies[name]
	if !ok {
		return nil, false
	}
	return ps.conds, true
}

// Names lists the partition's policies, sorted.
func (p *Partition) Names() []string {
	out := make([]string, 0, len(p.st.policies))
	for n := range p.st.policies {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Counts counts the partition's policies per condition.
func (p *Partition) Counts() map[Kind]int {
	out := map[Kind]int{}
	for _, ps := range p.st.policies {
		for _, c := range ps.conds {
			out[c.Kind]++
		}
	}
	return out
}

// Tracker judges conditions per snapshot and carries them from one snapshot
// to the next. It is safe for concurrent use. The zero value is not usable:
// NewTracker makes one.
type Tracker struct {
	mu sync.Mutex
	// last is, per (mesh, type), the newest state judged: the base the next
	// snapshot's judgement compares against.
	last map[[2]string]*state
	// Budget bounds lint's search per rule (0: lint's default).
	Budget int
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{last: map[[2]string]*state{}} }

// attachKey keys a tracker's partitions in a snapshot.
type attachKey struct {
	t         *Tracker
	mesh, typ string
}

type judged struct {
	p   *Partition
	err error
}

// Partition returns the conditions of the policies of mesh ("" = default)
// and typ ("" = TrafficPermission) in s: judged on the first call for s,
// then kept in s. It fails as engine.Snapshot.Partition does.
func (t *Tracker) Partition(s *engine.Snapshot, mesh, typ string) (*Partition, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	j := s.Attached(attachKey{t, mesh, typ}, func() any {
		p, err := t.judge(s, mesh, typ)
		return judged{p, err}
	}).(judged)
	return j.p, j.err
}

// Policy returns the conditions of one policy of s; false when s holds no
// such policy.
func (t *Tracker) Policy(s *engine.Snapshot, mesh, typ, name string) ([]Condition, bool) {
	p, err := t.Partition(s, mesh, typ)
	if err != nil {
		return nil, false
	}
	return p.Policy(name)
}

// Count is how many policies of a mesh hold one condition.
type Count struct {
	Mesh     string
	Kind     Kind
	Policies int
}

// Counts counts, per mesh and condition, the policies of s that hold it
// (every mesh and type judged); conditions no policy of a mesh holds are
// left out. Sorted by mesh, then Kind.
func (t *Tracker) Counts(s *engine.Snapshot) []Count {
	var out []Count
	for _, mesh := range s.Meshes() {
		sum := map[Kind]int{}
		for _, typ := range s.KnownTypes(mesh) {
			p, err := t.Partition(s, mesh, typ)
			if err != nil {
				continue
			}
			for k, n := range p.Counts() {
				sum[k] += n
			}
		}
		for _, k := range Kinds() {
			if sum[k] > 0 {
				out = append(out, Count{Mesh: mesh, Kind: k, Policies: sum[k]})
			}
		}
	}
	return out
}

// state is what a judgement of one partition knows: the frame every
// policy's conditions depend on, and each policy's findings.
type state struct {
	mesh, typ string
	rev       int64
	meshDoc   resource.Resource
	scopes    []*resource.Scope
	set       engine.Settings
	closed    bool
	notApp    [2]bool
	inv       *inventory.Inventory
	ends      *endTags // the inventory's tag sets, built on need
	policies  map[string]*pstate
	// config: an enforced valid policy carries configuration, so the
	// resolutions judge Overridden and PartiallyEnforced.
	config bool
}

// pstate is one policy as judged.
type pstate struct {
	doc   *resource.Policy
	err   string
	audit bool
	rules []*index.Rule
	// shadowed maps each enforced rule lint found shadowed to its message.
	shadowed map[string]string
	// enforced counts its enforced rules.
	enforced int
	dead     bool
	resolved resolveState
	conds    []Condition
}

// same reports whether q is p as compiled in the same frame.
func (p *pstate) same(q *pstate) bool {
	if p.doc != q.doc || p.err != q.err || p.audit != q.audit || len(p.rules) != len(q.rules) {
		return false
	}
	for i := range p.rules {
		if p.rules[i] != q.rules[i] {
			return false
		}
	}
	return true
}

// judging reports whether its rules take part in the enforced order.
func (p *pstate) judging() bool { return p.err == "" && !p.audit }

// enforcedRules are the policy's rules in the enforced order.
func (p *pstate) enforcedRules() []*index.Rule {
	if !p.judging() {
		return nil
	}
	out := make([]*index.Rule, 0, len(p.rules))
	for _, r := range p.rules {
		if !r.Audit {
			out = append(out, r)
		}
	}
	return out
}

// newState reads a partition's frame and policies.
func newState(s *engine.Snapshot, p *engine.Partition) *state {
	st := &state{mesh: p.Mesh(), typ: p.Type(), rev: p.Revision(), set: p.Settings(), closed: p.Closed(),
		inv: p.Inventory(), policies: map[string]*pstate{}}
	if e, ok := s.Get(resource.Key{Kind: resource.KindMesh, Mesh: st.mesh}); ok {
		st.meshDoc = e.Resource
	}
	for _, sv := range p.Scopes() {
		st.scopes = append(st.scopes, sv.Doc)
	}
	if !st.closed && p.Rules(false) != nil {
		st.notApp = [2]bool{p.NotApplicable(0), p.NotApplicable(1)}
	}
	for pv := range p.Policies() {
		ps := &pstate{doc: pv.Doc, err: pv.Err, audit: pv.Audit, rules: pv.Rules}
		ps.enforced = len(ps.enforcedRules())
		if ps.judging() && (len(pv.Doc.Conf) > 0 || pv.Doc.HasBlocks() || hasItemConf(pv.Doc)) {
			st.config = true
		}
		st.policies[pv.Doc.Name] = ps
	}
	return st
}

func hasItemConf(p *resource.Policy) bool {
	for _, items := range [2][]resource.Item{p.From, p.To} {
		for i := range items {
			if len(items[i].Conf) > 0 {
				return true
			}
		}
	}
	return false
}

// sameFrame reports whether every policy of st is judged as in base when
// it is compiled alike: the mesh, the scopes, the settings, whether the
// partition is closed and which sides are applicable.
func (st *state) sameFrame(base *state) bool {
	return base != nil && st.meshDoc == base.meshDoc && slices.Equal(st.scopes, base.scopes) && st.set == base.set &&
		st.closed == base.closed && st.notApp == base.notApp
}

// judge judges the partition of s, from the tracker's last state of it.
func (t *Tracker) judge(s *engine.Snapshot, mesh, typ string) (*Partition, error) {
	p, err := s.Partition(mesh, typ)
	if err != nil {
		return nil, err
	}
	key := [2]string{p.Mesh(), p.Type()}
	t.mu.Lock()
	base := t.last[key]
	t.mu.Unlock()
	st := newState(s, p)
	if err := st.judge(s, p, base, t.Budget); err != nil {
		return nil, err
	}
	t.mu.Lock()
	if cur := t.last[key]; cur == nil || cur.rev <= st.rev {
		t.last[key] = st
	}
	t.mu.Unlock()
	return &Partition{Mesh: st.mesh, Type: st.typ, Revision: st.rev, st: st}, nil
}

// judge fills every policy's findings, carrying base's where nothing they
// depend on changed, and settles the conditions.
func (st *state) judge(s *engine.Snapshot, p *engine.Partition, base *state, budget int) error {
	frame := st.sameFrame(base)
	var changed []string // names whose policy differs from base's (gone ones included)
	for name, ps := range st.policies {
		old, ok := (*pstate)(nil), false
		if base != nil {
			old, ok = base.policies[name]
		}
		if !frame || !ok || !ps.same(old) {
			changed = append(changed, name)
			continue
		}
		ps.shadowed, ps.dead, ps.resolved = old.shadowed, old.dead, old.resolved
	}
	if base != nil {
		for name := range base.policies {
			if _, ok := st.policies[name]; !ok {
				changed = append(changed, name)
			}
		}
	}
	slices.Sort(changed)
	sameInv := frame && base.inv == st.inv
	if sameInv {
		st.ends = base.ends
	}
	if !st.closed && !st.set.PerDestination {
		if err := st.judgeShadowed(s, p, base, frame, changed, budget); err != nil {
			return err
		}
	}
	st.judgeDead(p, changed, sameInv)
	if len(changed) > 0 || !sameInv || base.config != st.config {
		st.judgeResolved(s)
	}
	for _, ps := range st.policies {
		ps.conds = st.settle(ps)
	}
	return nil
}

// settle says which conditions a policy holds.
func (st *state) settle(ps *pstate) []Condition {
	if ps.err != "" {
		return []Condition{{Invalid, ps.err}}
	}
	out := []Condition{{Accepted, "valid"}}
	switch {
	case ps.audit:
		out = append(out, Condition{Audit, "in audit mode: its rules decide the shadow decision only (docs/audit.md)"})
	case st.closed:
		// An invalid stored resource closes the mesh and type: every flow
		// is denied, no policy is enforced.
	case ps.enforced > 0 && len(ps.shadowed) == ps.enforced:
		out = append(out, Condition{Shadowed, "no rule of it ever decides a flow: " + ruleMessages(ps.shadowed)})
	case ps.resolved.state == engine.Overridden:
		out = append(out, Condition{Overridden, ps.resolved.message})
	case ps.resolved.state == engine.PartiallyEnforced:
		out = append(out, Condition{PartiallyEnforced, ps.resolved.message})
	case len(ps.shadowed) > 0:
		out = append(out, Condition{PartiallyEnforced, fmt.Sprintf("%d of its %d rules never decide a flow: %s",
			len(ps.shadowed), ps.enforced, ruleMessages(ps.shadowed))})
	case st.set.PerDestination && !st.closed:
		out = append(out, Condition{Enforced, "enforced (select PerDestination: its rules are not judged shadowed)"})
	default:
		out = append(out, Condition{Enforced, "enforced"})
	}
	if ps.dead {
		out = append(out, Condition{NoWorkloads, fmt.Sprintf("selects none of the mesh's %d workloads", st.ends.workloads)})
	}
	return out
}

// ruleMessages lists shadowed rules with why, in rule order.
func ruleMessages(m map[string]string) string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id + ": " + m[id]
	}
	return strings.Join(parts, "; ")
}

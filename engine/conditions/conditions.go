package conditions

// The conditions themselves, the answer per partition, and the Tracker that
// carries them from one snapshot to the next (docs/lint.md, "Standing
// conditions").

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/internal/pmap"
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
	ps, ok := p.st.policies.Get(name)
	if !ok {
		return nil, false
	}
	return ps.conds, true
}

// Names lists the partition's policies, sorted.
func (p *Partition) Names() []string {
	out := make([]string, 0, p.st.policies.Len())
	p.st.policies.Range(func(n string, _ *pstate) bool {
		out = append(out, n)
		return true
	})
	slices.Sort(out)
	return out
}

// Counts counts the partition's policies per condition.
func (p *Partition) Counts() map[Kind]int { return maps.Clone(p.st.counts) }

// Tracker judges conditions per snapshot and carries them from one snapshot
// to the next. It is safe for concurrent use. The zero value is not usable:
// NewTracker makes one.
type Tracker struct {
	mu     sync.Mutex
	parts  map[[2]string]*tracked
	meshes map[string]*meshWorkloads
	// Budget bounds lint's search per rule (0: lint's default).
	Budget int
}

// tracked is what a tracker keeps of one (mesh, type).
type tracked struct {
	// judging serializes the judgements of the partition: ix is updated in
	// place.
	judging sync.Mutex
	// last is the newest state judged: the base the next judgement
	// compares against (under Tracker.mu).
	last *state
	// ix indexes the rules of ixOf's policies (under judging).
	ix   *ruleIndex
	ixOf *state
	// dead indexes deadOf's NoWorkloads (under judging; dead.go).
	dead   *deadIndex
	deadOf *state
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{parts: map[[2]string]*tracked{}, meshes: map[string]*meshWorkloads{}}
}

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
// policy's conditions depend on, and each policy's findings. It is
// immutable once judged; the next judgement shares what did not change.
type state struct {
	mesh, typ string
	rev       int64
	meshDoc   resource.Resource
	scopes    []*resource.Scope
	set       engine.Settings
	closed    bool
	notApp    [2]bool
	inv       *inventory.Inventory
	workloads int // the inventory's valid workloads
	pset      engine.PolicySet
	policies  pmap.Map[string, *pstate]
	counts    map[Kind]int
	// config: an enforced valid policy carries configuration, so the
	// resolutions judge Overridden and PartiallyEnforced.
	config int
}

// pstate is one policy as judged. It is immutable once settled: a change
// copies it.
type pstate struct {
	doc   *resource.Policy
	err   string
	audit bool
	rules []*index.Rule
	// shadowed maps each enforced rule lint found shadowed to its message.
	shadowed map[string]string
	// unproven: lint could not settle one of its rules (docs/lint.md).
	unproven bool
	// covers names, per shadowed rule, the policies whose rules lint's
	// proof stands on; decided holds, per other judged rule, a flow it
	// decides when lint gave one (shadow.go, keeps).
	covers  map[string][]string
	decided map[string]*flow
	// enforced counts its enforced rules.
	enforced int
	// dead: NoWorkloads; witness names a valid workload it selects, ""
	// when none (dead.go).
	dead     bool
	witness  string
	resolved resolveState
	conds    []Condition
}

func newPstate(pv engine.PolicyView) *pstate {
	ps := &pstate{doc: pv.Doc, err: pv.Err, audit: pv.Audit, rules: pv.Rules}
	if ps.judging() {
		for _, r := range ps.rules {
			if !r.Audit {
				ps.enforced++
			}
		}
	}
	return ps
}

// configures reports whether the policy carries configuration that
// Resolve merges across policies: defaults or overrides blocks, or a
// targetRef policy's conf. (A sources & destinations policy's conf is the
// deciding rule's, first match: what never decides is shadowed.)
func (p *pstate) configures() bool {
	return p.judging() && (p.doc.HasBlocks() || p.doc.TargetRef != nil && (len(p.doc.Conf) > 0 || hasItemConf(p.doc)))
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

// newFrame reads a partition's frame.
func newFrame(s *engine.Snapshot, p *engine.Partition) *state {
	st := &state{mesh: p.Mesh(), typ: p.Type(), rev: p.Revision(), set: p.Settings(), closed: p.Closed(),
		inv: p.Inventory(), pset: p.PolicySet()}
	if e, ok := s.Get(resource.Key{Kind: resource.KindMesh, Mesh: st.mesh}); ok {
		st.meshDoc = e.Resource
	}
	for _, sv := range p.Scopes() {
		st.scopes = append(st.scopes, sv.Doc)
	}
	if !st.closed && p.Rules(false) != nil {
		st.notApp = [2]bool{p.NotApplicable(0), p.NotApplicable(1)}
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
	tp := t.parts[key]
	if tp == nil {
		tp = &tracked{}
		t.parts[key] = tp
	}
	t.mu.Unlock()
	tp.judging.Lock()
	defer tp.judging.Unlock()
	t.mu.Lock()
	base := tp.last
	t.mu.Unlock()
	st := newFrame(s, p)
	j := &judgement{st: st, base: base, s: s, p: p, tp: tp, mw: t.meshWorkloads(st.mesh), budget: t.Budget}
	if err := j.run(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	if tp.last == nil || tp.last.rev <= st.rev {
		tp.last = st
	}
	t.mu.Unlock()
	return &Partition{Mesh: st.mesh, Type: st.typ, Revision: st.rev, st: st}, nil
}

// judgement is one judgement of a partition: st being made from base.
type judgement struct {
	st, base *state
	s        *engine.Snapshot
	p        *engine.Partition
	tp       *tracked
	mw       *meshWorkloads
	budget   int
	b        *pmap.Builder[string, *pstate]
	// fresh are the pstates made by this judgement (settled at the end).
	fresh map[string]*pstate
}

// edit returns name's pstate to write: a copy of the carried one, taken
// out of the counts until it is settled again; nil when there is none.
func (j *judgement) edit(name string) *pstate {
	if ps, ok := j.fresh[name]; ok {
		return ps
	}
	old, ok := j.b.Get(name)
	if !ok {
		return nil
	}
	j.uncount(old)
	cp := *old
	j.fresh[name] = &cp
	j.b.Set(name, &cp)
	return &cp
}

func (j *judgement) run() error {
	st, base := j.st, j.base
	j.fresh = map[string]*pstate{}
	frame := st.sameFrame(base)
	var changed []string
	if frame {
		var ok bool
		if changed, ok = st.pset.Changed(base.pset); !ok {
			frame = false
		}
	}
	if frame {
		j.b = base.policies.Builder()
		st.counts = maps.Clone(base.counts)
		st.config = base.config
		seen := map[string]bool{}
		kept := changed[:0]
		for _, name := range changed {
			if seen[name] {
				continue
			}
			seen[name] = true
			old, had := base.policies.Get(name)
			pv, has := j.p.Policy(name)
			if had && has && newPstate(pv).same(old) {
				continue // a neighbour in the map
			}
			kept = append(kept, name)
			if had {
				j.uncount(old)
				j.b.Delete(name)
				if old.configures() {
					st.config--
				}
			}
			if has {
				ps := newPstate(pv)
				j.fresh[name] = ps
				j.b.Set(name, ps)
				if ps.configures() {
					st.config++
				}
			}
		}
		changed = kept
		slices.Sort(changed)
	} else {
		j.b = pmap.New[string, *pstate](pmap.StringHash).Builder()
		st.counts = map[Kind]int{}
		for pv := range j.p.Policies() {
			ps := newPstate(pv)
			j.fresh[pv.Doc.Name] = ps
			j.b.Set(pv.Doc.Name, ps)
			if ps.configures() {
				st.config++
			}
		}
	}
	sameInv := frame && base.inv == st.inv
	if !st.closed && !st.set.PerDestination {
		if err := j.judgeShadowed(frame, changed); err != nil {
			return err
		}
	}
	var list []*inventory.WorkloadEntry
	j.mw.mu.Lock()
	j.mw.at(st.inv)
	j.judgeDead(j.mw, frame, changed, sameInv)
	resolves := func(x *state) bool { return x != nil && x.config > 0 && x.workloads > 0 && !x.closed }
	resolve := (len(changed) > 0 || !sameInv) && (resolves(st) || resolves(base))
	if resolve && resolves(st) {
		list = j.mw.first(maxResolutions)
	}
	j.mw.mu.Unlock()
	if resolve {
		j.judgeResolved(list)
	}
	for _, ps := range j.fresh {
		ps.conds = st.settle(ps)
		for _, c := range ps.conds {
			st.counts[c.Kind]++
		}
	}
	st.policies = j.b.Map()
	return nil
}

// uncount takes an old pstate's part out of the counts.
func (j *judgement) uncount(old *pstate) {
	for _, c := range old.conds {
		j.st.counts[c.Kind]--
		if j.st.counts[c.Kind] == 0 {
			delete(j.st.counts, c.Kind)
		}
	}
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
		out = append(out, Condition{NoWorkloads, "selects none of the mesh's workloads"})
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

// Moved lists the policies present in both p and prev (two judgements of one
// partition) whose conditions differ, sorted. Judgements a tracker carries
// share every policy they did not touch, so it costs O(change).
func (p *Partition) Moved(prev *Partition) []string {
	var out []string
	seen := map[string]bool{}
	pmap.Diff(prev.st.policies, p.st.policies, func(a, b *pstate) bool { return a == b }, func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		a, ok1 := prev.st.policies.Get(name)
		b, ok2 := p.st.policies.Get(name)
		if ok1 && ok2 && !slices.Equal(a.conds, b.conds) {
			out = append(out, name)
		}
	})
	slices.Sort(out)
	return out
}

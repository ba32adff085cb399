package analysis

// Impact (docs/analysis.md): the flows whose answer a proposed change would
// alter, found before anything is written. The change is validated as
// Apply's dry run, applied to a copy of the snapshot, and the flows are
// decided on both: the inventory's workload pairs on every class of flows
// the policies tell apart (flowclass.go), and the flows given (those the
// replicas observed). Only the flows the change can touch are decided twice:
// a flow whose tags no rule of a changed policy matches, old or new, keeps
// its answer unless the change moves something every flow of the partition
// depends on (a Mesh, a Scope, a workload, the partition's validity, whether
// a side has candidates at all), and then the whole partition is decided.

import (
	"math/bits"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ImpactRequest is a proposed change and the observed flows to replay.
type ImpactRequest struct {
	Puts    []resource.Resource
	Deletes []resource.Key
	Flows   []ObservedFlow
	// Explain asks for the after answer's explanation of each changed flow.
	Explain bool
	// Registry resolves identities of the observed flows (nil: none).
	Registry *inventory.Registry
}

// ObservedFlow is a flow a replica decided, with how often.
type ObservedFlow struct {
	Mesh, Type  string
	Source      inventory.Endpoint
	Destination inventory.Endpoint
	Protocol    resource.Protocol
	Port        uint32
	Count       uint64
}

// ImpactChange is one flow whose answer the change alters.
type ImpactChange struct {
	Mesh, Type string
	// Source and Destination are workload names for the inventory's pairs,
	// or the endpoints as observed.
	Source, Destination inventory.Endpoint
	// Class is the protocol and ports the change holds for (an observed
	// flow: its own protocol and port, Lo = Hi = Port).
	Class FlowClass
	// Observed: the flow was given; Count is how often it was seen.
	Observed bool
	Count    uint64
	// Before and After are the answers (a side's conf left out); Missing
	// says the flow has no answer on that snapshot (a workload or a type that
	// is not there), with the error.
	Before, After       engine.Decision
	BeforeErr, AfterErr string
	// Explain is the after answer's explanation, when asked for.
	Explain *engine.Explanation
}

// ImpactAnswer is Impact's answer.
type ImpactAnswer struct {
	Revision int64 // the revision the change was judged against
	Changes  []ImpactChange
	// Flows considered and flows decided on both snapshots.
	Considered, Redecided int
}

// Impact judges a proposed change to s (see the file comment). It fails
// with the validation error CheckApply gives for a write Apply would refuse.
func Impact(s *engine.Snapshot, req *ImpactRequest) (*ImpactAnswer, error) {
	after, changes, err := s.Preview(req.Puts, req.Deletes)
	if err != nil {
		return nil, err
	}
	parts := impactPartitions(s, after, changes, req.Flows)
	ans := &ImpactAnswer{Revision: s.Revision()}
	for _, p := range parts {
		impactPartition(s, after, p, req, ans)
	}
	return ans, nil
}

// impactPart is one (mesh, type) a change or a flow concerns.
type impactPart struct {
	mesh, typ string
	full      bool     // re-decide every flow of the partition
	policies  []string // the changed policies' names
	flows     []int    // indexes of the observed flows of the partition
}

// impactPartitions lists the partitions to judge: those whose policies
// change, every type of a mesh whose settings, scopes or workloads change,
// and those of the observed flows.
func impactPartitions(s, after *engine.Snapshot, changes []engine.Change, flows []ObservedFlow) []*impactPart {
	byKey := map[[2]string]*impactPart{}
	var order []*impactPart
	get := func(mesh, typ string) *impactPart {
		k := [2]string{mesh, typ}
		p, ok := byKey[k]
		if !ok {
			p = &impactPart{mesh: mesh, typ: typ}
			byKey[k] = p
			order = append(order, p)
		}
		return p
	}
	wholeMesh := map[string]bool{}
	for _, c := range changes {
		if c.Key.Kind == resource.KindPolicy {
			p := get(c.Key.Mesh, c.Key.Type)
			p.policies = append(p.policies, c.Key.Name)
		} else {
			wholeMesh[c.Key.Mesh] = true
		}
	}
	for _, c := range changes {
		if m := c.Key.Mesh; !wholeMesh[m] && !slices.Equal(s.KnownTypes(m), after.KnownTypes(m)) {
			// The change brings or takes a type (or the mesh's last
			// resource): a flow of any type there may answer otherwise.
			wholeMesh[m] = true
		}
	}
	for mesh := range wholeMesh {
		for _, snap := range []*engine.Snapshot{s, after} {
			for _, t := range snap.KnownTypes(mesh) {
				get(mesh, t).full = true
			}
		}
	}
	// Flows come in runs of one mesh and type: the last one's partition is
	// kept.
	var lastMesh, lastType string
	var last *impactPart
	lastOK := false
	for i := range flows {
		f := &flows[i]
		if i == 0 || f.Mesh != lastMesh || f.Type != lastType {
			lastMesh, lastType = f.Mesh, f.Type
			mesh, typ := f.Mesh, f.Type
			if mesh == "" {
				mesh = resource.DefaultMesh
			}
			if typ == "" {
				typ = resource.DefaultType
			}
			last, lastOK = byKey[[2]string{mesh, typ}]
			if !lastOK && wholeMesh[mesh] {
				// A type no snapshot knows in the mesh is decided by the
				// mesh's settings alone, which the change may move.
				last, lastOK = get(mesh, typ), true
				last.full = true
			}
		}
		if lastOK {
			last.flows = append(last.flows, i)
		}
	}
	slices.SortFunc(order, func(a, b *impactPart) int {
		if c := strings.Compare(a.mesh, b.mesh); c != 0 {
			return c
		}
		return strings.Compare(a.typ, b.typ)
	})
	return order
}

// touch says which flows of a partition a change can alter.
type touch struct {
	full  bool
	rules []*index.Rule // the changed policies' rules, before and after
	out   []*index.Rule // their outbound attachments (matched on the source)
	in    []*index.Rule // their inbound attachments (matched on the destination)
	// held caches, per list of groups and selector, the groups it holds
	// for (pairs: the same for every class of flows)
	held map[holdKey][]int32
}

// holdKey names a list of groups (by its first group) and a selector.
type holdKey struct {
	groups *[]impactEnd
	m      *index.Matcher
}

// endHits fills e's hits: which of at most 64 changed rules hold for its
// tags at each end, and whether a changed attachment does. With more rules
// (or a full touch) flows are tested whole (touches).
func (t *touch) endHits(e *impactEnd) {
	if t.full || len(t.rules) > 64 {
		return
	}
	for i, r := range t.rules {
		if matcherHolds(r.Src, e.tags) {
			e.hits[0] |= 1 << i
		}
		if matcherHolds(r.Dst, e.tags) {
			e.hits[1] |= 1 << i
		}
	}
	for _, r := range t.out {
		e.attached[0] = e.attached[0] || matcherHolds(r.Src, e.tags)
	}
	for _, r := range t.in {
		e.attached[1] = e.attached[1] || matcherHolds(r.Dst, e.tags)
	}
	e.hitsOK = true
}

// touchesEnds is touches for a flow whose ends have their hits.
func (t *touch) touchesEnds(src, dst *impactEnd, proto resource.Protocol, port uint32) bool {
	if src.attached[0] || dst.attached[1] {
		return true
	}
	for x := src.hits[0] & dst.hits[1]; x != 0; x &= x - 1 {
		if index.MatchesPorts(t.rules[bits.TrailingZeros64(x)].Ports, proto, port) {
			return true
		}
	}
	return false
}

// touches reports whether the change can alter the flow's answer.
func (t *touch) touches(f *index.Flow) bool {
	if t.full {
		return true
	}
	for _, r := range t.rules {
		if index.MatchesPorts(r.Ports, f.Proto, f.Port) && matcherHolds(r.Src, f.Src) && matcherHolds(r.Dst, f.Dst) {
			return true
		}
	}
	for _, r := range t.out {
		if matcherHolds(r.Src, f.Src) {
			return true
		}
	}
	for _, r := range t.in {
		if matcherHolds(r.Dst, f.Dst) {
			return true
		}
	}
	return false
}

// touchOf computes the touch of a change to policies of one partition.
func touchOf(s, after *engine.Snapshot, p *impactPart) *touch {
	t := &touch{full: p.full}
	if t.full {
		return t
	}
	pB, errB := s.Partition(p.mesh, p.typ)
	pA, errA := after.Partition(p.mesh, p.typ)
	if errB != nil || errA != nil || pB.Closed() != pA.Closed() || !pB.SameShape(pA) {
		t.full = true
		return t
	}
	for _, name := range p.policies {
		for _, part := range []*engine.Partition{pB, pA} {
			pv, ok := part.Policy(name)
			if !ok || pv.Err != "" {
				continue
			}
			t.rules = append(t.rules, pv.Rules...)
			for _, a := range pv.Attach {
				if a.Sides == index.SideIn {
					t.in = append(t.in, a)
				} else {
					t.out = append(t.out, a)
				}
			}
		}
	}
	return t
}

// impactEnd is one end of the partition's flows on both snapshots.
type impactEnd struct {
	// hits: which changed rules' selectors hold for the end, as a source
	// (hits[0]) and as a destination (hits[1]), and whether a changed
	// attachment does (attached); set when the touch is by rules
	// (touch.endHits), hitsOK then.
	hits     [2]uint64
	attached [2]bool
	hitsOK   bool
	ep       inventory.Endpoint
	b, a     ClassID
	bOK, aOK bool
	errB     string
	errA     string
	tags     resource.Tags // as decided after (before when gone after)
}

// impactPartition judges one partition into ans.
func impactPartition(s, after *engine.Snapshot, p *impactPart, req *ImpactRequest, ans *ImpactAnswer) {
	bb, errB := NewBulk(s, p.mesh, p.typ)
	ba, errA := NewBulk(after, p.mesh, p.typ)
	if errB != nil && errA != nil {
		return // neither snapshot answers the partition
	}
	t := touchOf(s, after, p)
	invB, invA := s.Inventory(p.mesh), after.Inventory(p.mesh)
	// judge decides a flow on both snapshots when the change can touch it;
	// it returns the change, or nil when the answer stays. n is how many
	// flows the call stands for.
	judge := func(src, dst *impactEnd, c FlowClass, n int) *ImpactChange {
		ans.Considered += n
		var touched bool
		if src.hitsOK && dst.hitsOK {
			touched = t.touchesEnds(src, dst, c.Protocol, c.Port)
		} else {
			f := index.Flow{Src: src.tags, Dst: dst.tags, Proto: c.Protocol, Port: c.Port}
			touched = t.touches(&f)
		}
		if !touched && src.bOK == src.aOK && dst.bOK == dst.aOK {
			return nil
		}
		ans.Redecided += n
		ch := &ImpactChange{Mesh: p.mesh, Type: p.typ, Source: src.ep, Destination: dst.ep, Class: c}
		var before, afterD *engine.Decision
		switch {
		case errB != nil:
			ch.BeforeErr = errB.Error()
		case !src.bOK || !dst.bOK:
			ch.BeforeErr = firstNonEmpty(src.errB, dst.errB)
		default:
			before = bb.Decide(src.b, dst.b, c.Protocol, c.Port)
			ch.Before = answerOnly(before)
		}
		switch {
		case errA != nil:
			ch.AfterErr = errA.Error()
		case !src.aOK || !dst.aOK:
			ch.AfterErr = firstNonEmpty(src.errA, dst.errA)
		default:
			afterD = ba.Decide(src.a, dst.a, c.Protocol, c.Port)
			ch.After = answerOnly(afterD)
		}
		if before != nil && afterD != nil && sameAnswer(before, afterD) || before == nil && afterD == nil {
			return nil
		}
		if req.Explain && afterD != nil {
			r := engine.Request{Mesh: p.mesh, Type: p.typ, Source: src.tags, Destination: dst.tags,
				Protocol: c.Protocol, Port: c.Port, Explain: true}
			if d, err := after.Decide(&r); err == nil {
				ch.Explain = d.Explain
			}
		}
		return ch
	}
	// The inventory's pairs, judged once per pair of groups (workloads of
	// one class on both snapshots), listed per pair. Only the pairs the
	// change can touch are judged: those a changed rule's selectors hold
	// for (found per group, not per pair), unless the whole partition is.
	names := unionNames(invB, invA)
	classes := FlowClasses(p.mesh, p.typ, s, after)
	srcEnds := endsOf(names, invB, invA, bb, ba, false, 0)
	srcs := groupEnds(srcEnds)
	tagged := portTagged(invB, invA)
	dstsAt := map[uint32][][]impactEnd{}
	dstEndsAt := map[uint32][]impactEnd{}
	dstEnds := func(port uint32) []impactEnd {
		if !tagged[port] {
			port = 0 // no workload has tags for it: its own tags
		}
		e, ok := dstEndsAt[port]
		if !ok {
			e = endsOf(names, invB, invA, bb, ba, true, port)
			dstEndsAt[port] = e
		}
		return e
	}
	emit := func(sg, dg []impactEnd, ch *ImpactChange) {
		for i := range sg {
			for j := range dg {
				one := *ch
				one.Source, one.Destination = sg[i].ep, dg[j].ep
				if one.BeforeErr != "" && errB == nil {
					one.BeforeErr = firstNonEmpty(sg[i].errB, dg[j].errB)
				}
				if one.AfterErr != "" && errA == nil {
					one.AfterErr = firstNonEmpty(sg[i].errA, dg[j].errA)
				}
				ans.Changes = append(ans.Changes, one)
			}
		}
	}
	for _, c := range classes {
		port := c.Port
		if !tagged[port] {
			port = 0 // no workload has tags for it: its own tags
		}
		dsts, ok := dstsAt[port]
		if !ok {
			dsts = groupEnds(dstEnds(port))
			dstsAt[port] = dsts
		}
		nSrc, nDst := 0, 0
		for _, g := range srcs {
			nSrc += len(g)
		}
		for _, g := range dsts {
			nDst += len(g)
		}
		for _, pr := range t.pairs(srcs, dsts, c) {
			sg, dg := srcs[pr[0]], dsts[pr[1]]
			ans.Considered -= len(sg) * len(dg) // counted below, with every pair
			if ch := judge(&sg[0], &dg[0], c, len(sg)*len(dg)); ch != nil {
				emit(sg, dg, ch)
			}
		}
		ans.Considered += nSrc * nDst
	}
	// The observed flows; their endpoints resolved once per form and port:
	// a workload both snapshots hold valid is the inventory's end above.
	nameIdx := make(map[string]int32, len(names))
	if errB == nil && errA == nil {
		for i, n := range names {
			nameIdx[n] = int32(i)
		}
	}
	ends := map[endKey]*impactEnd{}
	end := func(ep *inventory.Endpoint, destination bool, port uint32) *impactEnd {
		if ep.Workload != "" {
			if i, ok := nameIdx[ep.Workload]; ok && onlyWorkload(ep) {
				var e *impactEnd
				if destination {
					e = &dstEnds(port)[i]
				} else {
					e = &srcEnds[i]
				}
				if e.bOK && e.aOK {
					if !e.hitsOK {
						t.endHits(e)
					}
					return e
				}
			}
		}
		k, ok := endKeyOf(ep, destination, port)
		if ok {
			if e, hit := ends[k]; hit {
				return e
			}
		}
		e := observedEnd(*ep, s, after, bb, ba, p.mesh, destination, port, req.Registry)
		t.endHits(&e)
		if ok {
			ends[k] = &e
		}
		return &e
	}
	for _, i := range p.flows {
		o := &req.Flows[i]
		c := FlowClass{Protocol: o.Protocol, Port: o.Port, Lo: o.Port, Hi: o.Port}
		src, dst := end(&o.Source, false, 0), end(&o.Destination, true, o.Port)
		if ch := judge(src, dst, c, 1); ch != nil {
			ch.Source, ch.Destination = o.Source, o.Destination
			ch.Observed, ch.Count = true, o.Count
			ans.Changes = append(ans.Changes, *ch)
		}
	}
}

// pairs lists the pairs of groups (indexes into srcs and dsts) whose flows
// of class c the change can touch: every pair when the whole partition is
// touched, else those a changed rule matches (source and destination, and
// its ports), and those of a source or destination a changed attachment
// holds for.
func (t *touch) pairs(srcs, dsts [][]impactEnd, c FlowClass) [][2]int32 {
	all := func() [][2]int32 {
		out := make([][2]int32, 0, len(srcs)*len(dsts))
		for i := range srcs {
			for j := range dsts {
				out = append(out, [2]int32{int32(i), int32(j)})
			}
		}
		return out
	}
	if t.full {
		return all()
	}
	holding := func(groups [][]impactEnd, m *index.Matcher) []int32 {
		if len(groups) == 0 {
			return nil
		}
		k := holdKey{&groups[0], m}
		if out, ok := t.held[k]; ok {
			return out
		}
		var out []int32
		for i, g := range groups {
			if matcherHolds(m, g[0].tags) {
				out = append(out, int32(i))
			}
		}
		if t.held == nil {
			t.held = map[holdKey][]int32{}
		}
		t.held[k] = out
		return out
	}
	every := func(groups [][]impactEnd) []int32 {
		out := make([]int32, len(groups))
		for i := range out {
			out[i] = int32(i)
		}
		return out
	}
	seen := map[[2]int32]bool{}
	var out [][2]int32
	add := func(is, js []int32) {
		for _, i := range is {
			for _, j := range js {
				k := [2]int32{i, j}
				if !seen[k] {
					seen[k] = true
					out = append(out, k)
				}
			}
		}
	}
	for _, r := range t.rules {
		if index.MatchesPorts(r.Ports, c.Protocol, c.Port) {
			add(holding(srcs, r.Src), holding(dsts, r.Dst))
		}
	}
	for _, r := range t.out {
		add(holding(srcs, r.Src), every(dsts))
	}
	for _, r := range t.in {
		add(every(srcs), holding(dsts, r.Dst))
	}
	return out
}

// portTagged lists the ports some workload of either inventory gives tags
// to.
func portTagged(a, b *inventory.Inventory) map[uint32]bool {
	out := map[uint32]bool{}
	for _, inv := range []*inventory.Inventory{a, b} {
		for _, w := range workloadsOf(inv) {
			for _, p := range w.Workload.Ports {
				out[p.Port] = true
			}
		}
	}
	return out
}

// endKey names an endpoint given by reference, as an end of a flow.
type endKey struct {
	form        inventory.EndpointForm
	ref         string
	id          uint64
	destination bool
	port        uint32
}

// endKeyOf returns an endpoint's key; false for the tag form (not
// comparable, and cheap to intern).
func endKeyOf(ep *inventory.Endpoint, destination bool, port uint32) (endKey, bool) {
	k := endKey{form: ep.Form(), id: ep.Identity, destination: destination, port: port}
	switch k.form {
	case inventory.FormWorkload:
		k.ref = ep.Workload
	case inventory.FormAddress:
		k.ref = ep.Address
	case inventory.FormPrincipal:
		k.ref = ep.Principal
	case inventory.FormIdentity:
	default:
		return k, false
	}
	if !destination {
		k.port = 0
	}
	return k, true
}

// groupEnds groups ends by their classes on both snapshots.
func groupEnds(ends []impactEnd) [][]impactEnd {
	type gk struct {
		b, a     ClassID
		bOK, aOK bool
	}
	idx := map[gk]int{}
	var out [][]impactEnd
	for _, e := range ends {
		k := gk{e.b, e.a, e.bOK, e.aOK}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], e)
	}
	return out
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// answerOnly is an answer as Impact reports it: confs and resolutions left out.
func answerOnly(d *engine.Decision) engine.Decision {
	out := engine.Decision{Action: d.Action, Policy: d.Policy, Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound),
		Revision: d.Revision, Audit: d.Audit}
	return out
}

// sameAnswer reports whether a flow's answer is unchanged: the final action,
// each side (action, policy, scope, rule, reason) and the audit result.
func sameAnswer(a, b *engine.Decision) bool {
	if !sameSides(a, b) || a.Policy != b.Policy {
		return false
	}
	if (a.Audit == nil) != (b.Audit == nil) {
		return false
	}
	return a.Audit == nil || *a.Audit == *b.Audit
}

// unionNames lists the names of the valid workloads of either inventory,
// sorted.
func unionNames(a, b *inventory.Inventory) []string {
	var out []string
	for _, inv := range []*inventory.Inventory{a, b} {
		for _, w := range workloadsOf(inv) {
			out = append(out, w.Workload.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// endsOf resolves each workload as an end of the partition's flows on both
// snapshots.
func endsOf(names []string, invB, invA *inventory.Inventory, bb, ba *Bulk, destination bool, port uint32) []impactEnd {
	out := make([]impactEnd, len(names))
	var walks [2]ownWalk
	for i, n := range names {
		e := impactEnd{ep: inventory.Endpoint{Workload: n}}
		if w, ok := invB.Workload(n); ok && bb != nil {
			e.tags = peerTags(w, destination, port)
			e.b, e.bOK = walks[0].class(bb, w, destination, port, e.tags), true
		} else {
			e.errB = "no workload " + n
		}
		if w, ok := invA.Workload(n); ok && ba != nil {
			e.tags = peerTags(w, destination, port)
			e.a, e.aOK = walks[1].class(ba, w, destination, port, e.tags), true
		} else {
			e.errA = "no workload " + n
		}
		out[i] = e
	}
	return out
}

// ownWalk walks a Bulk's base's workloads by name, beside a list of names
// in order, to take each workload's class from the base.
type ownWalk struct{ next int }

// class returns the class of w's tags as an end of a flow (tags): the
// base's when they are w's own tags and the base holds w, else interned.
func (o *ownWalk) class(b *Bulk, w *inventory.WorkloadEntry, destination bool, port uint32, tags resource.Tags) ClassID {
	if b.base == nil {
		return b.Intern(tags)
	}
	if !destination {
		port = 0
	}
	if pt, _ := w.Workload.PortTags(port); len(pt) > 0 {
		return b.Intern(tags)
	}
	ws, order := b.base.workloads, b.base.byName()
	for o.next < len(order) && ws[order[o.next]].Workload.Name < w.Workload.Name {
		o.next++
	}
	if o.next < len(order) && ws[order[o.next]] == w {
		return b.base.own[order[o.next]]
	}
	return b.Intern(tags)
}

// observedEnd resolves an observed endpoint on both snapshots.
func observedEnd(ep inventory.Endpoint, s, after *engine.Snapshot, bb, ba *Bulk, mesh string, destination bool, port uint32, reg *inventory.Registry) impactEnd {
	e := impactEnd{ep: ep}
	if tags, err := s.EndpointTags(mesh, &ep, destination, port, reg); err == nil && bb != nil {
		e.tags = tags
		e.b, e.bOK = bb.Intern(tags), true
	} else if err != nil {
		e.errB = err.Error()
	}
	if tags, err := after.EndpointTags(mesh, &ep, destination, port, reg); err == nil && ba != nil {
		e.tags = tags
		e.a, e.aOK = ba.Intern(tags), true
	} else if err != nil {
		e.errA = err.Error()
	}
	return e
}

// onlyWorkload reports whether an endpoint gives a workload and nothing
// else (one that gives more is refused when resolved).
func onlyWorkload(ep *inventory.Endpoint) bool {
	return ep.Workload != "" && len(ep.Tags) == 0 && ep.Address == "" && ep.Principal == "" && ep.Identity == 0
}

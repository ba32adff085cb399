package engine_test

// A naive reference implementation of docs/order.md, written from the text and
// nothing else: every rule of the type is compiled on each call, candidates are
// found by a linear scan and sorted with a comparator that follows the order
// keys one by one. It is slow and obviously right; the differential tests check
// the indexed engine against it.

import (
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

type refRule struct {
	policy   *resource.Policy // nil for a catch-all
	scope    *resource.Scope  // nil: the mesh root
	phase    int              // 0 Absolute, 1 Default, 2 catch-all
	priority int32
	total    int
	exact    int
	item     int // item position or pair index
	src, dst *resource.Selector
	top      *resource.Selector // targetRef attachment
	inbound  bool               // from item (candidate inbound only)
	outbound bool               // to item (candidate outbound only)
	action   resource.Action
	conf     resource.Object
	id       string
}

type refWorld struct {
	mesh     *resource.Mesh
	scopes   []*resource.Scope // valid scopes in the total order
	byName   map[string]*resource.Scope
	policies []*resource.Policy // of the request's type
	anyRes   bool
	// known: the type is built in, declared in the Mesh's types, named in a
	// scope's catchAllTypes or used by a policy of the mesh (docs/types.md)
	known bool
}

func refLoad(resources []resource.Resource, mesh, typ string) refWorld {
	w := refWorld{byName: map[string]*resource.Scope{}, known: engine.IsBuiltinType(typ)}
	var scopes []*resource.Scope
	for _, r := range resources {
		switch t := r.(type) {
		case *resource.Mesh:
			if t.Name == mesh {
				w.mesh, w.anyRes = t, true
				if _, ok := t.Types[typ]; ok {
					w.known = true
				}
			}
		case *resource.Scope:
			if t.Mesh == mesh {
				scopes = append(scopes, t)
				w.anyRes = true
				for _, ct := range t.CatchAllTypes {
					w.known = w.known || ct == typ
				}
			}
		case *resource.Policy:
			if t.Mesh == mesh {
				w.anyRes = true
				if t.Type == typ {
					w.policies = append(w.policies, t)
					w.known = true
				}
			}
		}
	}
	all := map[string]*resource.Scope{}
	for _, s := range scopes {
		all[s.Name] = s
	}
	depth := func(s *resource.Scope) int {
		d := 0
		seen := map[string]bool{}
		for cur := s; cur.Parent != ""; d++ {
			if seen[cur.Name] {
				return -1
			}
			seen[cur.Name] = true
			p, ok := all[cur.Parent]
			if !ok {
				return -1
			}
			cur = p
		}
		return d
	}
	depths := map[string]int{}
	for _, s := range scopes {
		if d := depth(s); d >= 0 {
			depths[s.Name] = d
			w.scopes = append(w.scopes, s)
			w.byName[s.Name] = s
		}
	}
	sort.Slice(w.scopes, func(i, j int) bool {
		a, b := w.scopes[i], w.scopes[j]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		if depths[a.Name] != depths[b.Name] {
			return depths[a.Name] < depths[b.Name]
		}
		return a.Name < b.Name
	})
	var valid []*resource.Policy
	for _, p := range w.policies {
		if p.Scope == "" || w.byName[p.Scope] != nil {
			valid = append(valid, p)
		}
	}
	w.policies = valid
	return w
}

// position of a scope in the total order, from 1; the mesh root is 0.
func (w *refWorld) position(s *resource.Scope) int {
	if s == nil {
		return 0
	}
	for i, x := range w.scopes {
		if x == s {
			return i + 1
		}
	}
	panic("unknown scope")
}

func (w *refWorld) member(s *resource.Scope, tags resource.Tags) bool {
	for cur := s; cur != nil; cur = w.byName[cur.Parent] {
		ok := false
		for i := range cur.Selectors {
			if refSelects(&cur.Selectors[i], tags) {
				ok = true
			}
		}
		if !ok {
			return false
		}
		if cur.Parent == "" {
			return true
		}
	}
	return true
}

func refSelects(s *resource.Selector, tags resource.Tags) bool {
	for k, v := range s.Match {
		tv, ok := tags[k]
		if !ok || (v != "*" && tv != v) {
			return false
		}
	}
	for _, e := range s.Expressions {
		v, ok := tags[e.Key]
		in := false
		for _, x := range e.Values {
			if v == x {
				in = true
			}
		}
		switch e.Operator {
		case resource.OpIn:
			if !ok || !in {
				return false
			}
		case resource.OpNotIn:
			if ok && in {
				return false
			}
		case resource.OpExists:
			if !ok {
				return false
			}
		case resource.OpDoesNotExist:
			if ok {
				return false
			}
		case resource.OpPrefix:
			hit := false
			for _, x := range e.Values {
				if ok && strings.HasPrefix(v, x) {
					hit = true
				}
			}
			if !hit {
				return false
			}
		case resource.OpCIDR:
			a, err := netip.ParseAddr(v)
			hit := false
			for _, x := range e.Values {
				if !strings.Contains(x, "/") {
					x += "/32"
				}
				p, perr := netip.ParsePrefix(x)
				if ok && err == nil && perr == nil && p.Masked().Contains(a) {
					hit = true
				}
			}
			if !hit {
				return false
			}
		}
	}
	return true
}

func refRank(s *resource.Selector) (exact, wildcard int) {
	for _, v := range s.Match {
		if v == "*" {
			wildcard++
		} else {
			exact++
		}
	}
	for _, e := range s.Expressions {
		if e.Operator == resource.OpIn && len(e.Values) == 1 {
			exact++
		} else {
			wildcard++
		}
	}
	return
}

func refTarget(t resource.TargetRef) *resource.Selector {
	m := map[string]string{}
	switch t.Kind {
	case resource.TargetMeshSubset:
		for k, v := range t.Tags {
			m[k] = v
		}
	case resource.TargetService:
		m["kuma.io/service"] = t.Name
	case resource.TargetServiceSubset:
		for k, v := range t.Tags {
			m[k] = v
		}
		m["kuma.io/service"] = t.Name
	case resource.TargetProxy:
		// Kuma's Dataplane: one by name, by labels (tags), or every one.
		if t.Name != "" {
			m["kuma.io/name"] = t.Name
		}
		for k, v := range t.Tags {
			m[k] = v
		}
	}
	return &resource.Selector{Match: m, Expressions: t.Expressions}
}

// refLevel is a targetRef's specificity (docs/order.md, key 4): seed 002's
// Mesh < MeshSubset < Service < ServiceSubset < Proxy, with Kuma's Dataplane by
// labels (or every Dataplane) above Mesh and below MeshSubset, as Kuma orders
// its kinds (docs/kuma.md).
// Under a profile, Kuma's sort: Mesh < Dataplane (labels or every one <
// by name) < MeshSubset < MeshService < MeshServiceSubset (docs/kuma.md).
func refLevel(t resource.TargetRef, profile resource.Profile) int {
	if profile != resource.ProfileNone {
		switch t.Kind {
		case resource.TargetMesh:
			return 0
		case resource.TargetMeshSubset:
			return 3
		case resource.TargetService:
			return 4
		case resource.TargetServiceSubset:
			return 5
		}
		if t.Name == "" {
			return 1
		}
		return 2
	}
	switch t.Kind {
	case resource.TargetMesh:
		return 0
	case resource.TargetMeshSubset:
		return 2
	case resource.TargetService:
		return 3
	case resource.TargetServiceSubset:
		return 4
	}
	if t.Name == "" {
		return 1
	}
	return 5
}

func refPorts(entries []resource.PortEntry, proto resource.Protocol, port uint32) bool {
	if len(entries) == 0 {
		return true
	}
	for _, e := range entries {
		if e.Protocol != resource.ProtocolAny && e.Protocol != proto {
			continue
		}
		if e.Ports == "" || proto == resource.ICMP {
			return true
		}
		if port == 0 {
			continue
		}
		for _, part := range strings.Split(e.Ports, ",") {
			lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
			l, _ := strconv.Atoi(lo)
			h := l
			if isRange {
				h, _ = strconv.Atoi(hi)
			}
			if int(port) >= l && int(port) <= h {
				return true
			}
		}
	}
	return false
}

func (w *refWorld) rules(typ string) []*refRule {
	var out []*refRule
	for _, p := range w.policies {
		phase := 1
		if p.Rank == resource.RankAbsolute {
			phase = 0
		}
		act := func(a resource.Action) resource.Action {
			if a == resource.ActionUnset {
				return resource.Allow
			}
			return a
		}
		if p.TargetRef == nil {
			for i := range p.Sources {
				for j := range p.Destinations {
					se, sw := refRank(&p.Sources[i])
					de, dw := refRank(&p.Destinations[j])
					out = append(out, &refRule{
						policy: p, scope: w.byName[p.Scope], phase: phase, priority: p.Priority,
						total: se + sw + de + dw, exact: se + de, item: i*len(p.Destinations) + j,
						src: &p.Sources[i], dst: &p.Destinations[j], action: act(p.Action), conf: p.Conf,
						id: "sources[" + strconv.Itoa(i) + "]/destinations[" + strconv.Itoa(j) + "]",
					})
				}
			}
			continue
		}
		top := refTarget(*p.TargetRef)
		for i, it := range p.From {
			out = append(out, &refRule{policy: p, phase: phase, priority: p.Priority, total: refLevel(*p.TargetRef, w.profile()),
				item: i, src: refTarget(it.TargetRef), dst: top, top: top, inbound: true, action: act(it.Action),
				conf: it.Conf, id: "from[" + strconv.Itoa(i) + "]"})
		}
		for i, it := range p.To {
			out = append(out, &refRule{policy: p, phase: phase, priority: p.Priority, total: refLevel(*p.TargetRef, w.profile()),
				item: i, src: top, dst: refTarget(it.TargetRef), top: top, outbound: true, action: act(it.Action),
				conf: it.Conf, id: "to[" + strconv.Itoa(i) + "]"})
		}
	}
	for _, s := range w.scopes {
		if s.CatchAll == resource.ActionUnset {
			continue
		}
		types := s.CatchAllTypes
		if types == nil {
			types = []string{"TrafficPermission"}
		}
		for _, t := range types {
			if t == typ {
				out = append(out, &refRule{scope: s, phase: 2, action: s.CatchAll, id: "catchAll"})
			}
		}
	}
	return out
}

// refSettings are the settings of docs/resources.md for one type.
type refSettings struct {
	def, unenf resource.Action
	tb         resource.TieBreak
	io         resource.ItemOrder
	comb       resource.Combine
	perDest    bool
}

// settings resolves the mesh's settings for a type: a field set on the Mesh
// beats its profile (the table of docs/kuma.md, "Profiles"), which beats verdict's defaults;
// the profile's MeshTrafficPermission unenforcedAction is overridden only by
// the type's own field.
func (w *refWorld) settings(typ string) (def, unenf resource.Action, tb resource.TieBreak, io resource.ItemOrder, comb resource.Combine) {
	s := w.allSettings(typ)
	tb = s.tb
	// Equally specific targetRef policies: by name under a profile, unless
	// the type or the Mesh sets a tieBreak (docs/order.md, key 5).
	// (The policies of a type share one form: the first tells it.)
	if len(w.policies) > 0 && w.policies[0].TargetRef != nil && w.mesh != nil && w.mesh.Profile != resource.ProfileNone &&
		w.mesh.TieBreak == resource.TieBreakUnset && w.mesh.Types[typ].TieBreak == resource.TieBreakUnset {
		tb = resource.TieBreakName
	}
	return s.def, s.unenf, tb, s.io, s.comb
}

func (w *refWorld) profile() resource.Profile {
	if w.mesh == nil {
		return resource.ProfileNone
	}
	return w.mesh.Profile
}

// denyFirst reports whether r is a DENY item of a denyFirst policy: such
// items come before every other rule of their phase (docs/order.md, key 2).
func denyFirst(r *refRule) bool {
	return r.policy != nil && r.policy.DenyFirst && r.inbound && r.action == resource.Deny
}

func (w *refWorld) allSettings(typ string) refSettings {
	s := refSettings{def: resource.Deny, unenf: resource.Allow, tb: resource.TieBreakName, io: resource.FirstWins}
	if w.mesh == nil {
		return s
	}
	m := w.mesh
	profile := map[resource.Profile]struct {
		tb         resource.TieBreak
		io         resource.ItemOrder
		mtpUnenf   resource.Action
		tpSelectPD bool
	}{
		resource.ProfileNone:     {resource.TieBreakName, resource.FirstWins, resource.ActionUnset, false},
		resource.ProfileKuma:     {resource.TieBreakNewestCreated, resource.LastWins, resource.Deny, true},
		resource.ProfileKongMesh: {resource.TieBreakNewestModified, resource.LastWins, resource.Deny, true},
	}[m.Profile]
	if m.DefaultAction != resource.ActionUnset {
		s.def = m.DefaultAction
	}
	if m.UnenforcedAction != resource.ActionUnset {
		s.unenf = m.UnenforcedAction
	}
	s.tb, s.io = profile.tb, profile.io
	if m.TieBreak != resource.TieBreakUnset {
		s.tb = m.TieBreak
	}
	if m.ItemOrder != resource.ItemOrderUnset {
		s.io = m.ItemOrder
	}
	if typ == "MeshTrafficPermission" && profile.mtpUnenf != resource.ActionUnset {
		s.unenf = profile.mtpUnenf
	}
	s.perDest = typ == "TrafficPermission" && profile.tpSelectPD
	if ts, ok := m.Types[typ]; ok {
		s.comb = ts.Combine
		if ts.DefaultAction != resource.ActionUnset {
			s.def = ts.DefaultAction
		}
		if ts.UnenforcedAction != resource.ActionUnset {
			s.unenf = ts.UnenforcedAction
		}
		switch ts.Select {
		case resource.SelectAggregate:
			s.perDest = false
		case resource.SelectPerDestination:
			s.perDest = true
		}
		if ts.TieBreak != resource.TieBreakUnset {
			s.tb = ts.TieBreak
		}
	}
	return s
}

// before is the order of docs/order.md, key by key.
func (w *refWorld) before(a, b *refRule, tb resource.TieBreak, io resource.ItemOrder) bool {
	if a.phase != b.phase {
		return a.phase < b.phase
	}
	if da, db := denyFirst(a), denyFirst(b); da != db {
		return da
	}
	pa, pb := w.position(a.scope), w.position(b.scope)
	if pa != pb {
		if a.phase == 0 {
			return pa < pb // Absolute: forwards, the root first
		}
		return pa > pb // Default and catch-alls: backwards, the root last
	}
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if a.total != b.total {
		return a.total > b.total
	}
	if a.exact != b.exact {
		return a.exact > b.exact
	}
	if a.policy != b.policy {
		an, bn := a.policy.Name, b.policy.Name
		switch tb {
		case resource.TieBreakNewestCreated:
			if c := refNewer(a.policy.Meta.CreateRevision, b.policy.Meta.CreateRevision,
				a.policy.Meta.CreationTime.UnixNano(), b.policy.Meta.CreationTime.UnixNano(),
				a.policy.Meta.CreationTime.IsZero(), b.policy.Meta.CreationTime.IsZero()); c != 0 {
				return c > 0
			}
		case resource.TieBreakNewestModified:
			if c := refNewer(a.policy.Meta.ModRevision, b.policy.Meta.ModRevision,
				a.policy.Meta.ModificationTime.UnixNano(), b.policy.Meta.ModificationTime.UnixNano(),
				a.policy.Meta.ModificationTime.IsZero(), b.policy.Meta.ModificationTime.IsZero()); c != 0 {
				return c > 0
			}
		}
		return an < bn
	}
	if io == resource.LastWins && a.policy != nil && a.policy.TargetRef != nil {
		return a.item > b.item
	}
	return a.item < b.item
}

// refNewer: > 0 when a is newer than b, < 0 when older, 0 when equal. Store
// revisions first (in the server), then times; an absent time is the oldest.
func refNewer(ra, rb, ta, tb int64, za, zb bool) int {
	if ra != rb {
		if ra > rb {
			return 1
		}
		return -1
	}
	switch {
	case za && zb:
		return 0
	case za:
		return -1
	case zb:
		return 1
	case ta > tb:
		return 1
	case ta < tb:
		return -1
	}
	return 0
}

func refDecide(resources []resource.Resource, req engine.Request) (engine.Decision, bool) {
	mesh, typ := req.Mesh, req.Type
	if mesh == "" {
		mesh = "default"
	}
	if typ == "" {
		typ = "TrafficPermission"
	}
	w := refLoad(resources, mesh, typ)
	if !w.anyRes || !w.known {
		return engine.Decision{}, false
	}
	def, unenf, tb, io, comb := w.settings(typ)
	perDest := w.allSettings(typ).perDest
	rules := w.rules(typ)
	var sides [2]engine.SideDecision
	for side := 0; side < 2; side++ {
		workload := req.Source
		if side == 1 {
			workload = req.Destination
		}
		// not applicable
		applicable, hasPolicies := false, len(w.policies) > 0
		for _, p := range w.policies {
			if p.TargetRef == nil || (side == 0 && len(p.To) > 0) || (side == 1 && len(p.From) > 0) {
				applicable = true
			}
		}
		if hasPolicies && !applicable || perDest && side == 0 {
			sides[side] = engine.SideDecision{Action: resource.Allow, Reason: engine.ReasonNotApplicable}
			continue
		}
		// the most specific scope
		var specific *resource.Scope
		for _, s := range w.scopes {
			if w.member(s, workload) {
				specific = s
			}
		}
		if specific != nil && !specific.Enforced {
			sides[side] = engine.SideDecision{Action: unenf, Reason: engine.ReasonUnenforced}
			continue
		}
		var cands []*refRule
		for _, r := range rules {
			if (side == 0 && r.inbound) || (side == 1 && r.outbound) {
				continue
			}
			if r.scope != nil && !w.member(r.scope, workload) {
				continue
			}
			if r.top != nil && !refSelects(r.top, workload) {
				continue
			}
			cands = append(cands, r)
		}
		sort.SliceStable(cands, func(i, j int) bool { return w.before(cands[i], cands[j], tb, io) })
		matches := func(r *refRule) bool {
			if r.policy == nil {
				return true
			}
			return refPorts(r.policy.Ports, req.Protocol, req.Port) && refSelects(r.src, req.Source) && refSelects(r.dst, req.Destination)
		}
		var decider *refRule
		if perDest {
			// docs/order.md (select: PerDestination): the one policy most specific by its destination
			// selector (phase, scope and priority ignored; ties by tieBreak),
			// then its rules; else the catch-all, else defaultAction.
			chosen := w.refChoose(cands, req.Destination, tb)
			for _, r := range cands {
				if r.policy == nil && decider == nil {
					decider = r // the first catch-all, in case the chosen policy does not match
				}
				if r.policy != nil && r.policy == chosen && matches(r) {
					decider = r
					break
				}
			}
		} else if comb == resource.DenyOverrides {
			var firstAllow, firstCatch *refRule
			for _, r := range cands {
				if !matches(r) {
					continue
				}
				if r.policy == nil {
					if firstCatch == nil {
						firstCatch = r
					}
					continue
				}
				if r.action == resource.Deny && decider == nil {
					decider = r
				}
				if r.action == resource.Allow && firstAllow == nil {
					firstAllow = r
				}
			}
			if decider == nil {
				decider = firstAllow
			}
			if decider == nil {
				decider = firstCatch
			}
		} else {
			for _, r := range cands {
				if matches(r) {
					decider = r
					break
				}
			}
		}
		switch {
		case decider != nil && decider.policy == nil:
			sides[side] = engine.SideDecision{Action: decider.action, Scope: decider.scope.Name, Rule: "catchAll", Reason: engine.ReasonCatchAll}
		case decider != nil:
			sd := engine.SideDecision{Action: decider.action, Policy: decider.policy.Name, Rule: decider.id,
				Reason: engine.ReasonMatched, Conf: decider.conf}
			if decider.scope != nil {
				sd.Scope = decider.scope.Name
			}
			sides[side] = sd
		case len(cands) > 0:
			sides[side] = engine.SideDecision{Action: def, Reason: engine.ReasonDefaultAction}
		default:
			sides[side] = engine.SideDecision{Action: unenf, Reason: engine.ReasonUnenforced}
		}
	}
	out, in := sides[0], sides[1]
	d := engine.Decision{Outbound: out, Inbound: in, Action: resource.Allow}
	outDeny := out.Reason != engine.ReasonNotApplicable && out.Action == resource.Deny
	inDeny := in.Reason != engine.ReasonNotApplicable && in.Action == resource.Deny
	if outDeny || inDeny {
		d.Action = resource.Deny
	}
	decider := in
	if outDeny != inDeny {
		if outDeny {
			decider = out
		}
	} else if in.Reason != engine.ReasonMatched && in.Reason != engine.ReasonCatchAll {
		decider = out
	}
	d.Policy, d.Conf = decider.Policy, decider.Conf
	return d, true
}

// refChoose returns the policy of the candidates whose best destination
// selector that matches dst is the most specific (a targetRef policy's: its
// targetRef's level), ties by the tie-break; nil when none matches dst.
func (w *refWorld) refChoose(cands []*refRule, dst resource.Tags, tb resource.TieBreak) *resource.Policy {
	type claim struct {
		total, exact int
	}
	best := map[*resource.Policy]claim{}
	for _, r := range cands {
		if r.policy == nil || !refSelects(r.dst, dst) {
			continue
		}
		var c claim
		if r.policy.TargetRef == nil {
			e, wc := refRank(r.dst)
			c = claim{e + wc, e}
		} else {
			c = claim{refLevel(*r.policy.TargetRef, w.profile()), 0}
		}
		old, seen := best[r.policy]
		if !seen || c.total > old.total || c.total == old.total && c.exact > old.exact {
			best[r.policy] = c
		}
	}
	var chosen *resource.Policy
	var cc claim
	for p, c := range best {
		if chosen == nil || c.total > cc.total || c.total == cc.total && c.exact > cc.exact ||
			c == cc && w.tieFirst(p, chosen, tb) {
			chosen, cc = p, c
		}
	}
	return chosen
}

// tieFirst reports whether a comes before b by the tie-break alone.
func (w *refWorld) tieFirst(a, b *resource.Policy, tb resource.TieBreak) bool {
	ra := &refRule{policy: a}
	rb := &refRule{policy: b}
	return w.before(ra, rb, tb, resource.FirstWins)
}

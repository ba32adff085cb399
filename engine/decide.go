package engine

import (
	"fmt"
	"sync"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Request asks for the decision on one flow (docs/api.md, DecideRequest).
type Request struct {
	Mesh        string        // "" = default
	Type        string        // "" = TrafficPermission
	Source      resource.Tags // the tag form of the source (nil with SourceEndpoint)
	Destination resource.Tags // the tag form of the destination (nil with DestinationEndpoint)
	// SourceEndpoint and DestinationEndpoint give a side in any endpoint form
	// (a workload name, an address, a principal, an identity, or tags),
	// resolved against the mesh's inventory (endpoint.go); when one is set,
	// the side's tag field must be nil.
	SourceEndpoint      *inventory.Endpoint
	DestinationEndpoint *inventory.Endpoint
	// Registry, when set, is consulted for an identity that no valid
	// workload of the mesh has as its own tag set: the identities registered
	// through the API (identity.go). nil: the inventory alone.
	Registry *inventory.Registry
	Protocol resource.Protocol // ProtocolAny: not given
	Port     uint32            // 0: not given
	Explain  bool
	// NoCache decides without the snapshot's decision cache (benchmarks of the
	// scan itself; debugging). Explain never uses the cache.
	NoCache bool
	// TagIdentities asks for the identity of a side given as tags too
	// (EndpointResolution.Identity): from the memo when it answers (an entry
	// keeps its tag sets' identities), else computed. Without it that
	// identity is 0, and a decision hashes no tags.
	TagIdentities bool
	// procedure, for the engine's tests: with NoCache, the decision procedure
	// every class is scanned with (procLists, procBits); 0 lets each flow choose.
	procedure uint8
}

// Reason says how a side was decided (docs/order.md).
type Reason uint8

// Reasons.
const (
	ReasonMatched Reason = iota + 1
	ReasonCatchAll
	ReasonDefaultAction
	ReasonUnenforced
	ReasonNotApplicable
	ReasonInvalidResource // an invalid stored resource closes the mesh and type (invalid.go)
)

var reasonNames = []string{"", "MATCHED", "CATCH_ALL", "DEFAULT_ACTION", "UNENFORCED", "NOT_APPLICABLE", "INVALID_RESOURCE"}

func (r Reason) String() string { return reasonNames[r] }

// decidedByRule reports whether a rule (a catch-all counts) decided the side.
func (r Reason) decidedByRule() bool { return r == ReasonMatched || r == ReasonCatchAll }

// SideDecision is the answer of one side of a flow.
type SideDecision struct {
	Action resource.Action
	Policy string // the deciding policy; "" unless Reason is MATCHED
	Scope  string // the deciding rule's scope; "" for the mesh root and targetRef rules
	Rule   string // the deciding rule: "sources[0]/destinations[1]", "from[2]", "catchAll"
	Reason Reason
	Conf   resource.Object // the deciding rule's conf (shared; do not modify)
}

// Decision is the answer for a flow.
type Decision struct {
	Action   resource.Action
	Policy   string          // the policy that decided the final action
	Conf     resource.Object // its rule's conf (shared; do not modify)
	Outbound SideDecision
	Inbound  SideDecision
	Revision int64
	Explain  *Explanation // only when the request asked for it
	// How each end of the flow was resolved (endpoint.go); set by Decide on
	// every answer, cached or not.
	SourceResolution      inventory.EndpointResolution
	DestinationResolution inventory.EndpointResolution
	// Audit is the shadow result (docs/audit.md): set iff the shadow
	// decision, which enforces the audit rules too, has another final
	// action. Shared with the decision cache: do not modify.
	Audit *Audit
}

// Audit is what a decision would have been had its audit rules been enforced.
type Audit struct {
	Action resource.Action
	Policy string
	Scope  string
	Rule   string
	Side   string // "outbound" or "inbound": the side that decided the shadow result
}

// sideNames are the sides as Audit.Side names them.
var sideNames = [2]string{"outbound", "inbound"}

// scratch is the per-call working memory of Decide, pooled so that a decision
// allocates nothing: the scan's (index.Scratch) and the scopes' membership.
type scratch struct {
	index.Scratch
	own      [2][]uint32 // per side, per scope ord: == gen when the scope's own selectors match
	owned    [2][]int32  // per side: ords whose own selectors match
	members  [2][]int32  // per side: member ords
	specific [2]int32    // per side: the most specific member scope (the greatest ord), 0 for none
	// per side: the most specific member scope of the enforced decision, which
	// leaves audit scopes out (docs/audit.md)
	specificEnf [2]int32
	// pre, set by a caller of the bridge (partition.go), hands scanRules the
	// rules that match the flow instead of the index; pick takes them.
	pre  Prefilter
	pick Pick
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{Scratch: index.Scratch{Lists: [2][]index.List{make([]index.List, 0, 32), make([]index.List, 0, 16)}}}
}}

func (sc *scratch) reset(nScopes int) {
	sc.Gen++
	if sc.Gen == 0 { // wrapped: old stamps could look current
		for i := range sc.own {
			clear(sc.own[i])
			clear(sc.Mem[i])
		}
		sc.Gen = 1
	}
	for i := 0; i < 2; i++ {
		if len(sc.own[i]) < nScopes+1 {
			sc.own[i] = make([]uint32, nScopes+1)
			sc.Mem[i] = make([]uint32, nScopes+1)
		}
		sc.owned[i] = sc.owned[i][:0]
		sc.members[i] = sc.members[i][:0]
		sc.specific[i] = 0
		sc.specificEnf[i] = 0
	}
}

// computeMembers finds the scopes a workload is a member of: its own selectors
// match and so do every ancestor's.
func (sc *scratch) computeMembers(t *scopeTable, side int, tags resource.Tags) {
	sc.Scratch.Reach(t.index, tags, nil)
	own := sc.own[side]
	for _, ls := range sc.Lists {
		for _, l := range ls {
			for i := range l {
				r := l[i].R
				if own[r.Scope] != sc.Gen && r.Src.Matches(tags) {
					own[r.Scope] = sc.Gen
					sc.owned[side] = append(sc.owned[side], r.Scope)
				}
			}
		}
	}
	mem := sc.Mem[side]
	for _, ord := range sc.owned[side] {
		si := t.list[ord-1]
		ok := true
		for _, a := range si.ancestors {
			if own[a] != sc.Gen {
				ok = false
				break
			}
		}
		if ok {
			mem[ord] = sc.Gen
			sc.members[side] = append(sc.members[side], ord)
			if ord > sc.specific[side] {
				sc.specific[side] = ord
			}
			if ord > sc.specificEnf[side] && !si.audit {
				sc.specificEnf[side] = ord
			}
		}
	}
}

// Decide answers a flow (docs/order.md): each side's first matching candidate
// rule, then the final action. It takes no lock. Endpoints given by reference
// are resolved first (endpoint.go) and the flow is decided on the resolved
// tags. Answers are cached in the snapshot by resolved tags (cache.go); for
// the tag form and without Explain, a decision allocates nothing, except once
// per distinct flow seen twice (the cache entry).
// It fails with ErrMeshNotFound, ErrTypeNotFound for a type the mesh does not
// know, ErrEndpointNotFound for an unknown workload name, or
// ErrIdentityNotFound or ErrIdentityCollision for an identity (LookupIdentity).
func (s *Snapshot) Decide(req *Request) (Decision, error) {
	var d Decision
	err := s.decideInto(req, &d)
	return d, err
}

// decideInto is Decide, answering in d (zero). The path fills one Decision in
// place instead of returning it by value from call to call: a memo hit's
// frames stay small, so the goroutine of an RPC (which starts with a small
// stack) does not grow its stack for a decision (server BenchmarkDecide).
func (s *Snapshot) decideInto(req *Request, d *Decision) error {
	meshName := req.Mesh
	if meshName == "" {
		meshName = resource.DefaultMesh
	}
	typ := req.Type
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.lookupMesh(meshName, typ)
	if s.closedByType(meshName, ms, typ) != nil {
		s.decideClosed(ms, meshName, req, d)
		return nil
	}
	if !ok {
		return errNoMesh(meshName)
	}
	if err := req.resolveSides(ms, meshName, d); err != nil {
		return err
	}
	f := index.Flow{Src: d.SourceResolution.Tags, Dst: d.DestinationResolution.Tags, Proto: req.Protocol, Port: req.Port}
	var ids [2]uint64 // the memo's identities of the sides' tags, if it answered
	var err error
	if req.Explain || req.NoCache {
		err = s.decideDirect(ms, meshName, typ, req, &f, d)
	} else {
		ids, err = s.decideMemo(ms, &memoKey{Mesh: meshName, Type: typ, Flow: f}, inventory.TagsHash(f.Src), inventory.TagsHash(f.Dst), d)
	}
	req.identify(meshName, d, ids)
	return err
}

func errNoMesh(mesh string) error {
	return fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
}

// decideClosed answers a flow of a closed mesh and type in d: DENY whatever
// the endpoints are; their resolution is reported when it succeeds.
func (s *Snapshot) decideClosed(ms *meshState, mesh string, req *Request, d *Decision) {
	*d = closedDecision(s.revision, req.Explain)
	d.SourceResolution, _ = req.resolve(ms, mesh, false)
	d.DestinationResolution, _ = req.resolve(ms, mesh, true)
	req.identify(mesh, d, [2]uint64{})
}

// resolveSides resolves the request's source and destination into d's
// resolutions.
func (r *Request) resolveSides(ms *meshState, mesh string, d *Decision) error {
	if r.SourceEndpoint == nil && r.DestinationEndpoint == nil { // both as tags: set in place
		d.SourceResolution, d.DestinationResolution = asTags(r.Source), asTags(r.Destination)
		return nil
	}
	var err error
	if d.SourceResolution, err = r.resolve(ms, mesh, false); err != nil {
		return err
	}
	d.DestinationResolution, err = r.resolve(ms, mesh, true)
	return err
}

// identify completes the identities of d's resolutions that are wanted: a
// side given by an endpoint, or as tags with TagIdentities. It takes those
// the memo gave (memo; 0: none), else computes them.
func (r *Request) identify(mesh string, d *Decision, memo [2]uint64) {
	for i, side := range [2]struct {
		res *inventory.EndpointResolution
		ep  *inventory.Endpoint
	}{{&d.SourceResolution, r.SourceEndpoint}, {&d.DestinationResolution, r.DestinationEndpoint}} {
		switch {
		case side.ep == nil && !r.TagIdentities, side.res.Identity != 0, side.res.Form == 0: // not wanted, known, or not resolved
		case memo[i] != 0:
			side.res.Identity = memo[i]
		default:
			side.res.Identity = resource.Identity(mesh, side.res.Tags)
		}
	}
}

// setAnswer copies a's answer into d: every field but the resolutions, which
// are d's own (the endpoints as this request gave them).
func (d *Decision) setAnswer(a *Decision) {
	src, dst := d.SourceResolution, d.DestinationResolution
	*d = *a
	d.SourceResolution, d.DestinationResolution = src, dst
}

// decideDirect decides a resolved flow without the memo (Explain, NoCache)
// into d (zero but for its resolutions).
func (s *Snapshot) decideDirect(ms *meshState, mesh, typ string, req *Request, f *index.Flow, d *Decision) error {
	ts, set, err := s.lookupPart(ms, mesh, typ)
	if err != nil {
		return err
	}
	s.decideUncachedIn(ms, ts, typ, set, f, req.procedure, d)
	if req.Explain {
		d.Explain = ms.explain(typ, f, d)
	}
	return nil
}

// decideMemo answers k's flow from the memo into d, else decides it and
// remembers the answer (cache.go). srcHash and dstHash are the tag sets'
// tagsHash. It returns the identities of the flow's tag sets when the answer
// has a memo entry (0s otherwise); d's resolutions are left as they are.
func (s *Snapshot) decideMemo(ms *meshState, k *memoKey, srcHash, dstHash uint64, d *Decision) ([2]uint64, error) {
	k.Epoch = ms.epoch
	ts, set, err := s.lookupPart(ms, k.Mesh, k.Type)
	if ts != nil {
		k.Epoch = ts.epoch
	} else if err != nil {
		return [2]uint64{}, err // only known types are remembered
	}
	k.H = flowHashOf(k.Mesh, k.Type, srcHash, dstHash, k.Flow.Proto, k.Flow.Port)
	c := s.cache()
	e, ok := c.Lookup(k)
	if !ok {
		if e = s.decideMiss(ms, ts, set, c, k, d); e == nil {
			return [2]uint64{}, nil
		}
	}
	d.setAnswer(e.Answer())
	d.Revision = s.revision // the entry may be from an earlier snapshot of the same answers
	return e.IDs(), nil
}

// decideMiss decides k's flow, which the memo does not hold, and stores the
// answer; it returns the entry stored, or nil (the flow was seen once) with
// the answer in d.
// ts and set are the type's state and settings in ms.
func (s *Snapshot) decideMiss(ms *meshState, ts *typeState, set typeSettings, c *decisionCache, k *memoKey, d *Decision) *cacheEntry {
	var a Decision // without resolutions: the memo keeps answers only
	s.decideUncachedIn(ms, ts, k.Type, set, &k.Flow, 0, &a)
	e := c.Store(k, &a)
	if e == nil {
		d.setAnswer(&a)
	}
	return e
}

// resolve resolves the request's source (or destination) in the mesh.
func (r *Request) resolve(ms *meshState, mesh string, destination bool) (inventory.EndpointResolution, error) {
	ep, tags := r.SourceEndpoint, r.Source
	if destination {
		ep, tags = r.DestinationEndpoint, r.Destination
	}
	if ep == nil {
		return asTags(tags), nil
	}
	return resolveEndpoint(ms, mesh, ep, destination, r.Port, r.Registry, false)
}

// asTags is the resolution of an end given as tags (its Identity left to the
// caller).
func asTags(tags resource.Tags) inventory.EndpointResolution {
	return inventory.EndpointResolution{Form: inventory.FormTags, ResolvedAs: inventory.AsTags, Tags: tags}
}

// decideUncached decides a flow with the decision procedure into d's answer:
// every field but Explain and the resolutions, which it leaves as they are.
// Like the rest of the procedure, it fills d in place rather than return a
// Decision by value from call to call (each return copied it).
func (s *Snapshot) decideUncached(ms *meshState, typ string, f *index.Flow, procedure uint8, d *Decision) {
	ts, _ := ms.types.Get(typ)
	s.decideUncachedIn(ms, ts, typ, ms.settings.forType(typ), f, procedure, d)
}

// decideUncachedIn is decideUncached with the type's state (nil: no policy)
// and settings in ms found by the caller (lookupPart), which knows the type.
func (s *Snapshot) decideUncachedIn(ms *meshState, ts *typeState, typ string, set typeSettings, f *index.Flow, procedure uint8, d *Decision) {
	sc := scratchPool.Get().(*scratch)
	sc.Procedure = procedure
	ms.decideIn(ts, typ, set, f, sc, d)
	scratchPool.Put(sc)
	d.Revision = s.revision
}

func (ms *meshState) decide(typ string, f *index.Flow, sc *scratch, d *Decision) {
	ts, _ := ms.types.Get(typ)
	ms.decideIn(ts, typ, ms.settings.forType(typ), f, sc, d)
}

// decideIn is decide with the type's state (nil: no policy) and settings.
func (ms *meshState) decideIn(ts *typeState, typ string, set typeSettings, f *index.Flow, sc *scratch, d *Decision) {
	nScopes := ms.scopes.size()
	sc.reset(nScopes)
	if nScopes > 0 {
		sc.computeMembers(ms.scopes, 0, f.Src)
		sc.computeMembers(ms.scopes, 1, f.Dst)
	}
	var found picks
	ms.decideView(ts, typ, set, f, sc, false, &found, d)
	d.Audit = nil
	if ms.scopes.audit || ts.audited() {
		ms.decideShadow(ts, typ, set, f, sc, &found, d)
	}
}

// decideShadow sets d.Audit from the shadow decision (docs/audit.md): one more
// pass, over the audit rules only, bounded by the enforced rules already
// found.
func (ms *meshState) decideShadow(ts *typeState, typ string, set typeSettings, f *index.Flow, sc *scratch, found *picks, d *Decision) {
	var shadow Decision
	ms.decideView(ts, typ, set, f, sc, true, found, &shadow)
	if shadow.Action != d.Action {
		side := deciderSide(&shadow.Outbound, &shadow.Inbound)
		sd := &shadow.Outbound
		if side == 1 {
			sd = &shadow.Inbound
		}
		d.Audit = &Audit{Action: shadow.Action, Policy: sd.Policy, Scope: sd.Scope, Rule: sd.Rule, Side: sideNames[side]}
	}
}

// picks are the rules a scan found, per side: the first match, and under
// DenyOverrides the first DENY and the first ALLOW; need the sides scanned.
type picks struct {
	first, deny, allow [2]*index.Rule
	need               [2]bool
}

// decideView decides the flow as the enforced decision sees the mesh (shadow
// false: audit rules and scopes left out), or as the shadow decision does
// (every rule enforced), into d's sides and final action. The enforced view
// records the rules it found in found; the shadow view starts from them and
// scans the audit rules alone.
func (ms *meshState) decideView(ts *typeState, typ string, set typeSettings, f *index.Flow, sc *scratch, shadow bool, found *picks, d *Decision) {
	res := [2]*SideDecision{&d.Outbound, &d.Inbound}
	var need [2]bool
	for side := 0; side < 2; side++ {
		switch {
		case ts.notApplicable(side, shadow) || set.perDestination && side == 0:
			*res[side] = SideDecision{Action: resource.Allow, Reason: ReasonNotApplicable}
		case ms.unenforcedScope(sc, side, shadow):
			*res[side] = SideDecision{Action: set.unenforcedAction, Reason: ReasonUnenforced}
		default:
			need[side] = true
		}
	}
	if set.perDestination { // perdest.go
		if need[1] {
			*res[1] = ms.decidePerDestination(ts, typ, set, f, sc, shadow)
		}
		d.finish()
		return
	}
	if need[0] || need[1] {
		var p picks
		if ts == nil {
			// no policy of the type: catch-alls and fallbacks decide
		} else if !shadow {
			scanRules(ts.rules, set.combine, f, sc, need, &p)
			*found = p
		} else {
			p = *found
			if need[0] && !p.need[0] || need[1] && !p.need[1] {
				// A side the enforced decision did not scan (its view left it
				// unenforced or not applicable): scan the enforced rules anew.
				p = picks{}
				scanRules(ts.rules, set.combine, f, sc, need, &p)
			}
			scanRules(ts.audit.rules, set.combine, f, sc, need, &p)
		}
		for side := 0; side < 2; side++ {
			if need[side] {
				if r := p.first[side]; r != nil {
					res[side].setMatched(ms, r)
				} else {
					*res[side] = ms.sideResult(ts, typ, set, f, sc, side, nil, shadow)
				}
			}
		}
	}
	d.finish()
}

// scanRules finds in p, per side in need, the rule of ix that decides the
// side, unless the one p holds (found in other rules of the same order, or
// none) comes first. p is improved in place, not passed and returned by
// value: its copies read words just written, and stalled on them.
func scanRules(ix *index.Index, combine resource.Combine, f *index.Flow, sc *scratch, need [2]bool, p *picks) {
	p.need = need
	if ix == nil || ix.Size == 0 {
		return
	}
	if sc.pre != nil && scanPrefiltered(sc.pre, ix, combine, sc, need, p) {
		return
	}
	if combine == resource.DenyOverrides {
		index.ScanDenyOverrides(ix, f, &sc.Scratch, need, &p.first, &p.deny, &p.allow)
	} else {
		index.ScanFirstMatch(ix, f, &sc.Scratch, need, &p.first)
	}
}

// viewCounts are the counts of the valid policies a view sees: the shadow
// view every one, the enforced view those not in audit mode.
func (ts *typeState) viewCounts(shadow bool) formCounts {
	if shadow || ts.validAudit.policies == 0 {
		return ts.valid
	}
	return ts.enforcedCounts()
}

// notApplicable reports whether no policy of the type can ever be a candidate on
// the side (docs/order.md); catch-alls do not count.
func (ts *typeState) notApplicable(side int, shadow bool) bool {
	if ts == nil {
		return false
	}
	c := ts.viewCounts(shadow)
	if c.policies == 0 || c.sd > 0 {
		return false
	}
	if side == 0 {
		return c.to == 0
	}
	return c.from == 0
}

// unenforcedScope reports whether the workload's most specific scope has
// enforced: false; the enforced view leaves audit scopes out.
func (ms *meshState) unenforcedScope(sc *scratch, side int, shadow bool) bool {
	specific := sc.specificEnf[side]
	if shadow {
		specific = sc.specific[side]
	}
	if !ms.scopes.unenforced || specific == 0 {
		return false
	}
	return !ms.scopes.list[specific-1].doc.Enforced
}

func (ms *meshState) scopeName(ord int32) string {
	if ord == 0 {
		return ""
	}
	return ms.scopes.list[ord-1].doc.Name
}

// setMatched sets sd to the answer of the side rule r decided: field by
// field, not a SideDecision built and copied, whose copy of the freshly
// written words stalled on them.
func (sd *SideDecision) setMatched(ms *meshState, r *index.Rule) {
	sd.Action, sd.Reason = r.Action, ReasonMatched
	sd.Policy, sd.Scope, sd.Rule, sd.Conf = r.PolicyName(), ms.scopeName(r.Scope), r.ID, r.Conf
}

func (ms *meshState) sideResult(ts *typeState, typ string, set typeSettings, f *index.Flow, sc *scratch, side int, r *index.Rule, shadow bool) SideDecision {
	if r != nil {
		var sd SideDecision
		sd.setMatched(ms, r)
		return sd
	}
	if c := ms.catchAll(typ, sc, side, shadow); c != nil {
		return SideDecision{Action: c.Action, Scope: ms.scopeName(c.Scope), Rule: c.ID, Reason: ReasonCatchAll}
	}
	if ms.hasCandidate(ts, f, sc, side, shadow) {
		return SideDecision{Action: set.defaultAction, Reason: ReasonDefaultAction}
	}
	return SideDecision{Action: set.unenforcedAction, Reason: ReasonUnenforced}
}

// catchAll returns the catch-all that decides a side with no matching rule: the
// one of the workload's lowest-priority member scope that has one for the type
// (the enforced view leaves audit scopes out).
func (ms *meshState) catchAll(typ string, sc *scratch, side int, shadow bool) *index.Rule {
	if len(sc.members[side]) == 0 {
		return nil
	}
	for _, c := range ms.scopes.catchAlls[typ] {
		if (shadow || !c.Audit) && sc.IsMember(side, c.Scope) {
			return c
		}
	}
	return nil
}

// hasCandidate reports whether some policy rule of the type is a candidate on the
// side, matching or not; the shadow view counts the audit rules too.
func (ms *meshState) hasCandidate(ts *typeState, f *index.Flow, sc *scratch, side int, shadow bool) bool {
	if ts == nil || ts.viewCounts(shadow).policies == 0 {
		return false
	}
	if candidateIn(ts.scopeRules, ts.attachOut, ts.attachIn, f, sc, side) {
		return true
	}
	return shadow && candidateIn(ts.audit.scopeRules, ts.audit.attachOut, ts.audit.attachIn, f, sc, side)
}

func candidateIn(scopeRules []int32, attachOut, attachIn *index.Index, f *index.Flow, sc *scratch, side int) bool {
	if scopeRules[0] > 0 {
		return true
	}
	for _, ord := range sc.members[side] {
		if scopeRules[ord] > 0 {
			return true
		}
	}
	if side == 0 {
		return anyMatch(attachOut, f.Src, nil, sc)
	}
	return anyMatch(attachIn, nil, f.Dst, sc)
}

func anyMatch(ix *index.Index, src, dst resource.Tags, sc *scratch) bool {
	if ix.Size == 0 {
		return false
	}
	sc.Scratch.Reach(ix, src, dst)
	for _, ls := range sc.Lists {
		for _, l := range ls {
			for i := range l {
				if r := l[i].R; (r.Src == nil || r.Src.Matches(src)) && (r.Dst == nil || r.Dst.Matches(dst)) {
					return true
				}
			}
		}
	}
	return false
}

// finish combines d's sides into its final action (docs/order.md): the flow
// passes iff every applicable side allows; the deciding side is the denying
// one if exactly one denies, otherwise the inbound side, or the outbound side
// when the inbound side was decided by no rule.
func (d *Decision) finish() {
	out, in := &d.Outbound, &d.Inbound
	d.Action = resource.Allow
	if out.Reason != ReasonNotApplicable && out.Action == resource.Deny || in.Reason != ReasonNotApplicable && in.Action == resource.Deny {
		d.Action = resource.Deny
	}
	decider := in
	if deciderSide(out, in) == 0 {
		decider = out
	}
	d.Policy, d.Conf = decider.Policy, decider.Conf
}

// deciderSide is the side that decides the final action: 0 outbound, 1 inbound.
func deciderSide(out, in *SideDecision) int {
	denyOut := out.Reason != ReasonNotApplicable && out.Action == resource.Deny
	denyIn := in.Reason != ReasonNotApplicable && in.Action == resource.Deny
	switch {
	case denyOut != denyIn:
		if denyOut {
			return 0
		}
	case !in.Reason.decidedByRule():
		return 0
	}
	return 1
}

// partRef is one (mesh, type) partition of a snapshot as the decision path
// finds it, kept on the snapshot for the first partition decided there
// (Snapshot.part). A snapshot read at a past revision is mostly asked about
// one partition, and a caller going over many revisions finds their
// persistent maps' nodes out of the CPU caches: walking the meshes' map and
// the mesh's types' map costs a cache miss per level, one after the other,
// where the kept partition costs one. Never modified once kept.
type partRef struct {
	mesh, typ string
	ms        *meshState // nil: the mesh holds no resource
	ts        *typeState // nil: the type has no policy
	// With ms: the type's settings there, and ms.checkType(typ), so that a
	// decision hashes the type's name into no map.
	set     typeSettings
	typeErr error
}

// lookupMesh is s.meshes.Get(mesh), from the kept partition when it is
// (mesh, typ)'s; it keeps (mesh, typ) as the partition when none is kept yet.
func (s *Snapshot) lookupMesh(mesh, typ string) (*meshState, bool) {
	if r := s.part.Load(); r != nil && r.mesh == mesh && r.typ == typ {
		return r.ms, r.ms != nil
	}
	ms, ok := s.meshes.Get(mesh)
	if s.part.Load() == nil {
		r := &partRef{mesh: mesh, typ: typ, ms: ms}
		if ok {
			r.ts, _ = ms.types.Get(typ)
			r.set, r.typeErr = ms.settings.forType(typ), ms.checkType(typ)
		}
		s.part.CompareAndSwap(nil, r)
	}
	return ms, ok
}

// lookupPart returns the state of type typ in ms, s's mesh named mesh (nil
// when the type has no policy), its settings there, and ms.checkType(typ),
// from the kept partition when it is (mesh, typ)'s.
func (s *Snapshot) lookupPart(ms *meshState, mesh, typ string) (*typeState, typeSettings, error) {
	if r := s.part.Load(); r != nil && r.ms == ms && r.mesh == mesh && r.typ == typ {
		return r.ts, r.set, r.typeErr
	}
	if err := ms.checkType(typ); err != nil {
		return nil, typeSettings{}, err
	}
	ts, _ := ms.types.Get(typ)
	return ts, ms.settings.forType(typ), nil
}

package engine

// The compact path's scope and its identity-pair memo. A compact batch names
// one (mesh, type) and thousands of flows as (source identity, destination
// identity, protocol, port); PairScope resolves the partition once — the mesh,
// the type's epoch, whether an invalid resource closes it, the registry's part
// for the mesh — and each flow then costs two integer lookups and one memo
// probe.
//
// The identity-pair memo sits in front of the tag memo (cache.go): keyed by the
// two identities, the protocol and the port, it points at the tag memo's entry
// for the flow, so a hit is one atomic load and a compare of three words and
// two pointers, without the tag memo's hash over strings. It belongs to the
// partition's epoch (memoEpoch.pairs): whatever renews the epoch — every
// change that may alter the partition's answers — starts the next snapshots on
// an empty pair memo, and whatever keeps it (a workload put, another type's
// policy, another mesh) keeps the pair memo as well. A hit is verified against
// the interned tag sets the flow's identities resolve to now (by pointer): an
// identity that resolves to another set object (a workload re-interned, a set
// registered again after eviction) misses here and is answered by the tag
// memo, which compares the tags themselves. An identity that no longer
// resolves never reaches the memo. The memo is a fixed array (pairSlots
// pointers, two choices per flow): bounded, lock-free, and an entry is made
// only for a flow the tag memo holds (seen twice), so one-off flows allocate
// nothing here.
//
// A flow the memo holds is answered by its identities alone (DecideIDs),
// without resolving them, while the resolutions its entry was verified with
// still hold: an entry carries the generations of the inventory's identities
// and of the registry at which its sets were last resolved, and a scope
// trusts it when both are the scope's own. A workload put that changes no
// identity keeps the inventory's generation, so workload churn leaves the
// shortcut on; any change of the registry (a set added or evicted, the CLOCK
// hand's pass) renews its generation, and the next resolution of each flow
// (the full path) renews its entry. The CLOCK's second chance stays exact: the
// hand renews the generation when it clears a set's mark, so a set in use is
// resolved — and marked — again before the hand comes back to it.
//
// An entry carries its answer packed (PairAnswer: the final action, the audit
// bits, the deciding policy's number), so a hit reads one entry and no
// Decision. The number is the pair memo's own (PolicyNumbers): a policy name
// gets one when a decision by it is first packed, and the numbering lives and
// dies with the pair memo, hence with the epoch — whatever changes the
// partition's answers starts a new numbering, and no number is reused within
// one.

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// resolutionGen is what the identities of a partition resolve to: the
// inventory's generation (0: no inventory) and the registry's.
type resolutionGen struct{ inv, reg uint64 }

const pairSlots = 1 << 14 // a power of 2; 128 KiB of pointers per partition in use

type pairMemo struct {
	slots [pairSlots]atomic.Pointer[pairEntry]
	// gen is the last scope's resolutionGen, shared by the scopes that have
	// the same, so that an entry's check is a pointer compare.
	gen atomic.Pointer[resolutionGen]
	// policies numbers the policies its entries' answers name.
	policies PolicyNumbers
}

// pairEntry is one flow between identities, its packed answer and the tag
// memo's entry that answers it. Never modified once stored. 64 bytes: a hit
// reads one cache line.
type pairEntry struct {
	src, dst uint64
	pp       uint64 // protocol<<32 | port
	ans      PairAnswer
	// valid is the resolutionGen at which srcSet and dstSet were last what
	// src and dst resolve to (the only field written after the entry is
	// stored).
	valid          atomic.Pointer[resolutionGen]
	srcSet, dstSet *inventory.TagSet
	e              *cacheEntry
}

// PairAnswer is a decision packed for the compact path: the final action,
// whether the shadow (audit) result differs and its action, and the number
// of the deciding policy in the scope's PolicyNumbers.
type PairAnswer uint64

const (
	answerDeny      PairAnswer = 1 << 32 // the final action is DENY (else ALLOW)
	answerAudit     PairAnswer = 1 << 33 // the shadow result differs (Decision.Audit set)
	answerAuditDeny PairAnswer = 1 << 34 // the shadow action is DENY
)

// Deny reports whether the final action is DENY (else it is ALLOW).
func (a PairAnswer) Deny() bool { return a&answerDeny != 0 }

// AuditDiffers reports whether the shadow result has another final action
// (Decision.Audit != nil); AuditDeny whether that action is DENY.
func (a PairAnswer) AuditDiffers() bool { return a&answerAudit != 0 }

// AuditDeny reports whether the shadow action is DENY (when AuditDiffers).
func (a PairAnswer) AuditDeny() bool { return a&answerAuditDeny != 0 }

// Policy is the deciding policy's number in the scope's PolicyNumbers; 0 is
// no policy ("").
func (a PairAnswer) Policy() uint32 { return uint32(a) }

func packAnswer(d *Decision, pn *PolicyNumbers) PairAnswer {
	a := PairAnswer(pn.number(d.Policy))
	if d.Action == resource.Deny {
		a |= answerDeny
	}
	if d.Audit != nil {
		a |= answerAudit
		if d.Audit.Action == resource.Deny {
			a |= answerAuditDeny
		}
	}
	return a
}

// PolicyNumbers numbers the policies that decide a partition's flows, densely
// from 1 in the order they are first seen; 0 is no policy (""). Within one
// numbering a number names one policy and a policy has one number, forever;
// two scopes with the same numbering (PairScope.Policies) agree. Safe for
// concurrent use; Name never locks.
type PolicyNumbers struct {
	byName sync.Map // policy name → uint32
	mu     sync.Mutex
	all    []string                 // under mu; all[n] is number n's name
	names  atomic.Pointer[[]string] // a prefix of all, published
}

// noPolicies is the numbering of a closed partition, whose one decision is by
// no policy.
var noPolicies PolicyNumbers

func (pn *PolicyNumbers) number(name string) uint32 {
	if name == "" {
		return 0
	}
	if n, ok := pn.byName.Load(name); ok {
		return n.(uint32)
	}
	pn.mu.Lock()
	defer pn.mu.Unlock()
	if n, ok := pn.byName.Load(name); ok {
		return n.(uint32)
	}
	if len(pn.all) == 0 {
		pn.all = append(pn.all, "")
	}
	// Appended past every published length: a reader of an earlier prefix
	// never reads the element written here.
	pn.all = append(pn.all, name)
	names := pn.all
	pn.names.Store(&names)
	n := uint32(len(names) - 1)
	pn.byName.Store(name, n)
	return n
}

// Name is the name of policy number n, as the answers that carry n were
// packed with ("" for 0).
func (pn *PolicyNumbers) Name(n uint32) string {
	if n == 0 {
		return ""
	}
	return (*pn.names.Load())[n]
}

func pairHash(src, dst, pp uint64) uint64 {
	return inventory.Mix64(src ^ inventory.Mix64(dst+0x9E3779B97F4A7C15) ^ inventory.Mix64(pp+0x632BE59BD9B4E019))
}

// PairScope is a (mesh, type) partition of one snapshot, resolved once for a
// batch of flows between identities. Read-only once made: safe for
// concurrent use.
type PairScope struct {
	s      *Snapshot
	ms     *meshState // nil: the mesh holds no resource (then closed)
	mesh   string
	typ    string
	closed *Decision // an invalid stored resource closes the partition: every flow is denied
	epoch  *memoEpoch
	reg    *inventory.MeshRegistry
	pairs  *pairMemo
	cache  *decisionCache
	gen    *resolutionGen // loaded before any of the scope's lookups
}

// PairScope resolves mesh and type ("" = the defaults) for flows between
// identities registered in reg (may be nil). ErrMeshNotFound or
// ErrTypeNotFound as CheckMeshType; a partition closed by an invalid stored
// resource can be decided (it answers DENY).
func (s *Snapshot) PairScope(mesh, typ string, reg *inventory.Registry) (*PairScope, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(mesh)
	// The generations first: what the scope resolves later is at least as
	// new as they say.
	gen := resolutionGen{reg: reg.Generation()}
	if ok && ms.inv != nil {
		gen.inv = ms.inv.Gen
	}
	p := &PairScope{s: s, mesh: mesh, typ: typ, reg: reg.Mesh(mesh)}
	if ok {
		p.ms = ms
	}
	if s.closedByType(mesh, p.ms, typ) != nil {
		d := closedDecision(s.revision, false)
		p.closed = &d
		return p, nil
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
	}
	p.epoch = ms.epoch
	if ts, ok := ms.types.Get(typ); ok {
		p.epoch = ts.epoch
	} else if err := ms.checkType(typ); err != nil {
		return nil, err
	}
	p.cache = s.cache()
	p.pairs = p.epoch.pairs.Load()
	if p.pairs == nil {
		m := &pairMemo{}
		if !p.epoch.pairs.CompareAndSwap(nil, m) {
			m = p.epoch.pairs.Load()
		}
		p.pairs = m
	}
	if g := p.pairs.gen.Load(); g != nil && *g == gen {
		p.gen = g
	} else {
		p.gen = &gen
		p.pairs.gen.Store(p.gen)
	}
	return p, nil
}

// Policies is the numbering of the policies in the scope's answers
// (PairAnswer.Policy). Scopes of one partition share it while the partition's
// answers stay the same (the epoch); a change that may alter them gives the
// next snapshots' scopes a new one.
func (p *PairScope) Policies() *PolicyNumbers {
	if p.closed != nil {
		return &noPolicies
	}
	return &p.pairs.policies
}

// DecideIDs answers a flow between identities from the identity-pair memo
// alone, without resolving them, when the memo holds the flow and both
// identities resolve as they did when its entry was last verified (the
// scope's generations). It returns the packed answer and the entry that
// holds it, whose decision and tag sets (what the identities resolve to) are
// for the decision log: reading them costs a cache line the answer does not.
// ok false: resolve them (Lookup) and call Answer.
func (p *PairScope) DecideIDs(src, dst uint64, proto resource.Protocol, port uint32) (a PairAnswer, pe *PairEntry, ok bool) {
	if p.closed != nil {
		return 0, nil, false
	}
	pp := uint64(proto)<<32 | uint64(port)
	h := pairHash(src, dst, pp)
	for _, sl := range [2]*atomic.Pointer[pairEntry]{&p.pairs.slots[h&(pairSlots-1)], &p.pairs.slots[(h>>32)&(pairSlots-1)]} {
		if pe := sl.Load(); p.answers(pe, src, dst, pp) {
			return pe.ans, (*PairEntry)(pe), true
		}
	}
	return 0, nil, false
}

// answers reports whether pe (nil: no) is the flow's entry and its identities
// still resolve as when it was last verified (the scope's generations).
func (p *PairScope) answers(pe *pairEntry, src, dst, pp uint64) bool {
	if pe == nil || pe.src != src || pe.dst != dst || pe.pp != pp {
		return false
	}
	v := pe.valid.Load()
	return v == p.gen || v != nil && *v == *p.gen
}

// DecideIDsN is DecideIDs for a batch of flows: flow i is srcs[i] → dsts[i]
// at pps[i] (port | protocol<<16, the compact path's packing), and ents[i]
// becomes the entry that answers it (Answer), or nil (resolve its identities
// and call Answer). ents must hold 2×len(srcs) entries; only the first
// len(srcs) mean anything after the call. The slots of every flow are read
// before any entry, so that the cache misses of many flows overlap instead of
// following one another.
func (p *PairScope) DecideIDsN(srcs, dsts []uint64, pps []uint32, ents []*PairEntry) {
	n := len(srcs)
	ents, dsts, pps = ents[:2*n], dsts[:n], pps[:n]
	if p.closed != nil {
		clear(ents)
		return
	}
	slots := &p.pairs.slots
	for i := range n {
		h := pairHash(srcs[i], dsts[i], uint64(pps[i]>>16)<<32|uint64(pps[i]&0xffff))
		ents[2*i] = (*PairEntry)(slots[h&(pairSlots-1)].Load())
		ents[2*i+1] = (*PairEntry)(slots[(h>>32)&(pairSlots-1)].Load())
	}
	for i := range n {
		pp := uint64(pps[i]>>16)<<32 | uint64(pps[i]&0xffff)
		var hit *PairEntry
		for _, pe := range ents[2*i : 2*i+2] {
			if p.answers((*pairEntry)(pe), srcs[i], dsts[i], pp) {
				hit = pe
				break
			}
		}
		ents[i] = hit // i ≤ 2i: the pairs of the flows after i are still unread
	}
}

// PairEntry is the pair memo's entry that answered a flow (DecideIDs): its
// decision and tag sets, read only when needed (the decision log).
type PairEntry pairEntry

// Answer is the entry's packed answer.
func (e *PairEntry) Answer() PairAnswer { return e.ans }

// Decision is the entry's decision, shared with the memo: read only.
func (e *PairEntry) Decision() *Decision { return &e.e.d }

// Sets are the tag sets the flow's identities resolve to.
func (e *PairEntry) Sets() (src, dst *inventory.TagSet) { return e.srcSet, e.dstSet }

// Lookup returns the tag set of an identity in the scope's mesh, as
// Snapshot.LookupIdentity.
func (p *PairScope) Lookup(id uint64) (*inventory.TagSet, error) {
	if p.ms == nil {
		return nil, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, p.mesh)
	}
	return p.ms.lookupIdentity(id, p.reg)
}

// Decide answers a flow between interned tag sets (from Lookup) as DecideSets
// does. The decision is shared with the memo: the caller must not modify it,
// and its Revision may be an earlier snapshot's with the same answers (the
// scope's snapshot's revision is the one to report). memo is true when a memo
// (the identity-pair memo or the tag memo behind it) gave the answer, false
// when the decision procedure ran (or the partition is closed): what the
// server's memo counter counts.
func (p *PairScope) Decide(src, dst *inventory.TagSet, proto resource.Protocol, port uint32) (d *Decision, memo bool) {
	_, d, memo = p.Answer(src, dst, proto, port)
	return d, memo
}

// Answer is Decide with the decision packed as well (numbered in Policies).
func (p *PairScope) Answer(src, dst *inventory.TagSet, proto resource.Protocol, port uint32) (a PairAnswer, d *Decision, memo bool) {
	if p.closed != nil {
		return answerDeny, p.closed, false
	}
	pp := uint64(proto)<<32 | uint64(port)
	h := pairHash(src.Identity(), dst.Identity(), pp)
	s1, s2 := &p.pairs.slots[h&(pairSlots-1)], &p.pairs.slots[(h>>32)&(pairSlots-1)]
	for _, sl := range [2]*atomic.Pointer[pairEntry]{s1, s2} {
		if pe := sl.Load(); pe != nil && pe.src == src.Identity() && pe.dst == dst.Identity() && pe.pp == pp && pe.srcSet == src && pe.dstSet == dst {
			if pe.valid.Load() != p.gen { // resolved again, at the scope's generations: DecideIDs may trust it
				pe.valid.Store(p.gen)
			}
			return pe.ans, &pe.e.d, true
		}
	}
	miss := p.cache.pairMisses.Add(1)
	k := memoKey{epoch: p.epoch, mesh: p.mesh, typ: p.typ, f: index.Flow{Src: src.Tags(), Dst: dst.Tags(), Proto: proto, Port: port}, src: src, dst: dst}
	k.h = flowHashOf(p.mesh, p.typ, src.Hash(), dst.Hash(), proto, port)
	e, memo := p.cache.lookup(&k)
	if !memo {
		d := new(Decision)
		p.s.decideUncached(p.ms, p.typ, &k.f, 0, d)
		if e = p.cache.store(&k, d); e == nil {
			return packAnswer(d, &p.pairs.policies), d, false // seen once: remembered by neither memo
		}
	}
	pe := &pairEntry{src: src.Identity(), dst: dst.Identity(), pp: pp, ans: packAnswer(&e.d, &p.pairs.policies), srcSet: src, dstSet: dst, e: e}
	pe.valid.Store(p.gen)
	// A free choice, else either (by the miss count's parity): a flow that
	// keeps coming back is stored again when pushed out.
	switch {
	case s1.Load() == nil:
		s1.Store(pe)
	case s2.Load() == nil || miss&1 == 0:
		s2.Store(pe)
	default:
		s1.Store(pe)
	}
	return pe.ans, &e.d, memo
}

// Revision is the revision of the scope's snapshot.
func (p *PairScope) Revision() int64 { return p.s.revision }

// pairMisses is the number of identity-pair memo lookups that missed (tests).
func (s *Snapshot) pairMisses() uint64 { return s.cache().pairMisses.Load() }

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

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/internal/memo"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The compact path's packed answers, their policy numbering and the pair
// memo's entries are the memo's (engine/internal/memo); the server reads
// them through these names.
type (
	// PairAnswer is a decision packed for the compact path: the final
	// action, whether the shadow (audit) result differs and its action, and
	// the number of the deciding policy in the scope's PolicyNumbers.
	PairAnswer = memo.PairAnswer
	// PolicyNumbers numbers the policies that decide a partition's flows,
	// densely from 1 in the order they are first seen; 0 is no policy ("").
	PolicyNumbers = memo.PolicyNumbers
	// PairEntry is the pair memo's entry that answered a flow (DecideIDs):
	// its packed answer, its decision and tag sets, read only when needed
	// (the decision log).
	PairEntry = memo.PairEntry[Decision]
)

const answerDeny = memo.AnswerDeny

// noPolicies is the numbering of a closed partition, whose one decision is by
// no policy.
var noPolicies PolicyNumbers

func packAnswer(d *Decision, pn *PolicyNumbers) PairAnswer {
	a := PairAnswer(pn.Number(d.Policy))
	if d.Action == resource.Deny {
		a |= memo.AnswerDeny
	}
	if d.Audit != nil {
		a |= memo.AnswerAudit
		if d.Audit.Action == resource.Deny {
			a |= memo.AnswerAuditDeny
		}
	}
	return a
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
	gen    *memo.Gen // loaded before any of the scope's lookups
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
	gen := memo.Gen{Reg: reg.Generation()}
	if ok && ms.inv != nil {
		gen.Inv = ms.inv.Gen
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
	p.pairs = p.epoch.Pairs()
	p.gen = p.pairs.Gen(gen)
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
	return p.pairs.Policies()
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
	if pe := p.pairs.Probe(src, dst, uint64(proto)<<32|uint64(port), p.gen); pe != nil {
		return pe.Answer(), pe, true
	}
	return 0, nil, false
}

// DecideIDsN is DecideIDs for a batch of flows: flow i is srcs[i] → dsts[i]
// at pps[i] (port | protocol<<16, the compact path's packing), and ents[i]
// becomes the entry that answers it (Answer), or nil (resolve its identities
// and call Answer). ents must hold 2×len(srcs) entries; only the first
// len(srcs) mean anything after the call. The slots of every flow are read
// before any entry, so that the cache misses of many flows overlap instead of
// following one another.
func (p *PairScope) DecideIDsN(srcs, dsts []uint64, pps []uint32, ents []*PairEntry) {
	if p.closed != nil {
		clear(ents[:2*len(srcs)])
		return
	}
	p.pairs.ProbeN(srcs, dsts, pps, ents, p.gen)
}

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
	if pe := p.pairs.Find(src, dst, pp, p.gen); pe != nil {
		return pe.Answer(), pe.Decision(), true
	}
	miss := p.cache.PairMiss()
	k := memoKey{Epoch: p.epoch, Mesh: p.mesh, Type: p.typ, Flow: index.Flow{Src: src.Tags(), Dst: dst.Tags(), Proto: proto, Port: port}, Src: src, Dst: dst}
	k.H = flowHashOf(p.mesh, p.typ, src.Hash(), dst.Hash(), proto, port)
	e, memo := p.cache.Lookup(&k)
	if !memo {
		d := new(Decision)
		p.s.decideUncached(p.ms, p.typ, &k.Flow, 0, d)
		if e = p.cache.Store(&k, d); e == nil {
			return packAnswer(d, p.pairs.Policies()), d, false // seen once: remembered by neither memo
		}
	}
	pe := p.pairs.Insert(src, dst, pp, packAnswer(e.Answer(), p.pairs.Policies()), e, p.gen, miss)
	return pe.Answer(), e.Answer(), memo
}

// Revision is the revision of the scope's snapshot.
func (p *PairScope) Revision() int64 { return p.s.revision }

// pairMisses is the number of identity-pair memo lookups that missed (tests).
func (s *Snapshot) pairMisses() uint64 { return s.cache().PairMisses() }

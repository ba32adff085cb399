package memo

import (
	"sync"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/inventory"
)

// The identity-pair memo of one (mesh, type) partition (docs: the engine's
// PairScope). Keyed by the two identities, the protocol and the port, an
// entry points at the tag memo's entry for the flow, so a hit is one atomic
// load and a compare of three words and two pointers, without the tag memo's
// hash over strings. It belongs to the partition's Epoch: whatever renews the
// epoch starts the next snapshots on an empty pair memo. A fixed array of
// PairSlots pointers, two choices per flow: bounded and lock-free.

// Gen is what the identities of a partition resolve to: the inventory's
// generation (0: no inventory) and the registry's. An entry is trusted by
// its identities alone while the generations it was verified at hold.
type Gen struct{ Inv, Reg uint64 }

// PairSlots is the size of a pair memo: a power of 2; 128 KiB of pointers per
// partition in use.
const PairSlots = 1 << 14

// Pairs is a partition's identity-pair memo.
type Pairs[D any] struct {
	slots [PairSlots]atomic.Pointer[PairEntry[D]]
	// gen is the last scope's Gen, shared by the scopes that have the same,
	// so that an entry's check is a pointer compare.
	gen atomic.Pointer[Gen]
	// policies numbers the policies its entries' answers name.
	policies PolicyNumbers
}

// Pairs returns the epoch's pair memo, creating it on first use.
func (e *Epoch[D]) Pairs() *Pairs[D] {
	if m := e.pairs.Load(); m != nil {
		return m
	}
	m := &Pairs[D]{}
	if !e.pairs.CompareAndSwap(nil, m) {
		m = e.pairs.Load()
	}
	return m
}

// Gen returns the generation to check entries against: g itself, or the
// equal one the memo shares already (so that a check is a pointer compare).
func (m *Pairs[D]) Gen(g Gen) *Gen {
	if cur := m.gen.Load(); cur != nil && *cur == g {
		return cur
	}
	m.gen.Store(&g)
	return &g
}

// Policies is the numbering of the policies in the memo's answers.
func (m *Pairs[D]) Policies() *PolicyNumbers { return &m.policies }

// PairEntry is one flow between identities, its packed answer and the tag
// memo's entry that answers it. Never modified once stored, but for valid.
// 64 bytes: a hit reads one cache line.
type PairEntry[D any] struct {
	src, dst uint64
	pp       uint32 // protocol<<16 | port: packPP
	// seen counts the entry's uses since the last Take, for a caller that
	// counts them (the server's observed flows) in the line a hit reads.
	seen atomic.Uint32
	ans  PairAnswer
	// valid is the Gen at which srcSet and dstSet were last what src and dst
	// resolve to (written after the entry is stored, as seen is).
	valid          atomic.Pointer[Gen]
	srcSet, dstSet *inventory.TagSet
	e              *Entry[D]
}

// packPP packs a protocol<<32 | port into an entry's 32 bits; false when
// either is over 16 bits (such a flow is never stored: it has no entry).
func packPP(pp uint64) (uint32, bool) {
	proto, port := pp>>32, pp&0xffffffff
	return uint32(proto<<16 | port), proto <= 0xffff && port <= 0xffff
}

// Seen counts one use of the entry and reports whether it is the first
// since the last Take: the caller that counts uses then keeps the entry
// until it takes them. Counts are exact while every counted entry is taken
// within 2³² uses, and while one caller counts (two would take each other's).
func (pe *PairEntry[D]) Seen() (first bool) { return pe.seen.Add(1) == 1 }

// Take returns the uses counted since the last Take and zeroes them.
func (pe *PairEntry[D]) Take() uint32 { return pe.seen.Swap(0) }

// PortProtocol is the entry's protocol<<16 | port (the compact path's packing).
func (pe *PairEntry[D]) PortProtocol() uint32 { return pe.pp }

// Answer is the entry's packed answer.
func (pe *PairEntry[D]) Answer() PairAnswer { return pe.ans }

// Decision is the entry's decision, shared with the memo: read only.
func (pe *PairEntry[D]) Decision() *D { return pe.e.d }

// Sets are the tag sets the flow's identities resolve to.
func (pe *PairEntry[D]) Sets() (src, dst *inventory.TagSet) { return pe.srcSet, pe.dstSet }

func pairHash(src, dst, pp uint64) uint64 {
	return inventory.Mix64(src ^ inventory.Mix64(dst+0x9E3779B97F4A7C15) ^ inventory.Mix64(pp+0x632BE59BD9B4E019))
}

// answers reports whether pe (nil: no) is the flow's entry and its identities
// still resolve as when it was last verified (gen).
func (pe *PairEntry[D]) answers(src, dst uint64, pp uint32, gen *Gen) bool {
	if pe == nil || pe.src != src || pe.dst != dst || pe.pp != pp {
		return false
	}
	v := pe.valid.Load()
	return v == gen || v != nil && *v == *gen
}

// Probe returns the entry of a flow between identities whose identities still
// resolve as at gen, or nil.
func (m *Pairs[D]) Probe(src, dst, pp uint64, gen *Gen) *PairEntry[D] {
	p32, ok := packPP(pp)
	if !ok {
		return nil
	}
	h := pairHash(src, dst, pp)
	for _, sl := range [2]*atomic.Pointer[PairEntry[D]]{&m.slots[h&(PairSlots-1)], &m.slots[(h>>32)&(PairSlots-1)]} {
		if pe := sl.Load(); pe.answers(src, dst, p32, gen) {
			return pe
		}
	}
	return nil
}

// ProbeN is Probe for a batch: flow i is srcs[i] → dsts[i] at pps[i] (port |
// protocol<<16, the compact path's packing), and ents[i] becomes its entry
// or nil. ents must hold 2×len(srcs) entries; only the first len(srcs) mean
// anything after the call. The slots of every flow are read before any
// entry, so that the cache misses of many flows overlap instead of following
// one another.
func (m *Pairs[D]) ProbeN(srcs, dsts []uint64, pps []uint32, ents []*PairEntry[D], gen *Gen) {
	n := len(srcs)
	ents, dsts, pps = ents[:2*n], dsts[:n], pps[:n]
	for i := range n {
		h := pairHash(srcs[i], dsts[i], uint64(pps[i]>>16)<<32|uint64(pps[i]&0xffff))
		ents[2*i] = m.slots[h&(PairSlots-1)].Load()
		ents[2*i+1] = m.slots[(h>>32)&(PairSlots-1)].Load()
	}
	for i := range n {
		var hit *PairEntry[D]
		for _, pe := range ents[2*i : 2*i+2] {
			if pe.answers(srcs[i], dsts[i], pps[i], gen) {
				hit = pe
				break
			}
		}
		ents[i] = hit // i ≤ 2i: the pairs of the flows after i are still unread
	}
}

// Find returns the entry of a flow between the interned sets src and dst,
// marking it verified at gen, or nil.
func (m *Pairs[D]) Find(src, dst *inventory.TagSet, pp uint64, gen *Gen) *PairEntry[D] {
	p32, ok := packPP(pp)
	if !ok {
		return nil
	}
	h := pairHash(src.Identity(), dst.Identity(), pp)
	for _, sl := range [2]*atomic.Pointer[PairEntry[D]]{&m.slots[h&(PairSlots-1)], &m.slots[(h>>32)&(PairSlots-1)]} {
		if pe := sl.Load(); pe != nil && pe.src == src.Identity() && pe.dst == dst.Identity() && pe.pp == p32 &&
			pe.srcSet == src && pe.dstSet == dst {
			if pe.valid.Load() != gen { // resolved again, at gen: Probe may trust it
				pe.valid.Store(gen)
			}
			return pe
		}
	}
	return nil
}

// Insert remembers the flow between src and dst answered by the tag memo's
// entry e, verified at gen, and returns the new entry. miss is a count of
// misses: with no free choice, its parity picks the slot, so a flow that
// keeps coming back is stored again when pushed out.
func (m *Pairs[D]) Insert(src, dst *inventory.TagSet, pp uint64, ans PairAnswer, e *Entry[D], gen *Gen, miss uint64) *PairEntry[D] {
	p32, ok := packPP(pp)
	pe := &PairEntry[D]{src: src.Identity(), dst: dst.Identity(), pp: p32, ans: ans, srcSet: src, dstSet: dst, e: e}
	pe.valid.Store(gen)
	if !ok {
		return pe // answered, never stored: Probe and Find refuse its pp
	}
	h := pairHash(pe.src, pe.dst, pp)
	s1, s2 := &m.slots[h&(PairSlots-1)], &m.slots[(h>>32)&(PairSlots-1)]
	switch {
	case s1.Load() == nil:
		s1.Store(pe)
	case s2.Load() == nil || miss&1 == 0:
		s2.Store(pe)
	default:
		s1.Store(pe)
	}
	return pe
}

// PairAnswer is a decision packed for the compact path: the final action,
// whether the shadow (audit) result differs and its action, and the number
// of the deciding policy in the memo's PolicyNumbers.
type PairAnswer uint64

// The bits of a PairAnswer above the policy number.
const (
	AnswerDeny      PairAnswer = 1 << 32 // the final action is DENY (else ALLOW)
	AnswerAudit     PairAnswer = 1 << 33 // the shadow result differs (Decision.Audit set)
	AnswerAuditDeny PairAnswer = 1 << 34 // the shadow action is DENY
)

// Deny reports whether the final action is DENY (else it is ALLOW).
func (a PairAnswer) Deny() bool { return a&AnswerDeny != 0 }

// AuditDiffers reports whether the shadow result has another final action
// (Decision.Audit != nil); AuditDeny whether that action is DENY.
func (a PairAnswer) AuditDiffers() bool { return a&AnswerAudit != 0 }

// AuditDeny reports whether the shadow action is DENY (when AuditDiffers).
func (a PairAnswer) AuditDeny() bool { return a&AnswerAuditDeny != 0 }

// Policy is the deciding policy's number in the memo's PolicyNumbers; 0 is
// no policy ("").
func (a PairAnswer) Policy() uint32 { return uint32(a) }

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

// Number returns the number of a policy name, giving it one if it has none.
func (pn *PolicyNumbers) Number(name string) uint32 {
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

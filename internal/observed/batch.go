package observed

import (
	"math"
	"sync"
	"unsafe"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The compact path decides millions of flows between identities a second,
// most of them again and again: each is counted first in a stripe's cache,
// a small set-associative table keyed by the flow's tag sets (pointers: a
// tag set names one identity for its life) and port, and reaches the table
// when its slot is needed for another flow, at Run's tick, or at a read. A
// batch holds one stripe, tried lock by lock from a hint, so that two cores
// rarely meet on one.
//
// A count touches two cache lines: the set's tags (a 16-bit fingerprint per
// way, 8 bytes a set, so a stripe's tags stay in a core's cache) and the one
// slot whose fingerprint matches (a slot is one line). The miss path, a
// flow the set does not hold, reads no slot but the one it replaces.

const (
	stripeSetBits = 12
	stripeSets    = 1 << stripeSetBits
	stripeWays    = 4
)

type stripe struct {
	slots [stripeSets][stripeWays]slot // first: a stripe starts on a line, so does each slot
	tags  [stripeSets][stripeWays]uint16
	next  [stripeSets]uint8 // the way a set replaces next
	mu    sync.Mutex
	// tallied are the memo entries registered since the last take (tally.go);
	// spare is the list the last take emptied, for the next.
	tallied, spare []tallied
	_              [8]byte // a stripe's size is whole lines (TestLayout)
}

// slot counts one flow between identities since the slot took it, in one
// cache line. The last answer's policy is held as its name's bytes (the
// snapshot's string, kept alive by the pointer) and length, packed with the
// action in meta.
type slot struct {
	src, dst    *inventory.TagSet // nil: empty
	mt, pp      uint32
	count       uint32
	meta        uint32 // len(policy)<<8 | action
	policy      *byte
	first, last int64
	rev         int64
}

// maxPolicyLen is the longest policy name a slot holds; a longer one (no
// valid resource name is) goes to the table at once.
const maxPolicyLen = 1<<24 - 1

// Batch counts the flows of one compact batch (one mesh and type) into a
// stripe it holds until Done.
type Batch struct {
	t    *Table
	s    *stripe
	mt   uint32
	now  int64
	sink uintptr
}

// Batch returns a batch for flows of mesh and typ, seen now, holding a
// stripe chosen from hint (say, the batch's first identity): call Done.
func (t *Table) Batch(mesh, typ string, hint uint64) Batch {
	n := uint64(len(t.stripes))
	var s *stripe
	for i := uint64(0); i < n; i++ {
		c := &t.stripes[(hint+i)%n]
		if c.mu.TryLock() {
			s = c
			break
		}
	}
	if s == nil {
		s = &t.stripes[hint%n]
		s.mu.Lock()
	}
	return Batch{t: t, s: s, mt: t.meshType(mesh, typ), now: t.now().UnixNano()}
}

// Done releases the batch's stripe.
func (b *Batch) Done() { b.s.mu.Unlock() }

// IdentityFlow is one flow of a batch for IdentitiesN: its tag sets, its
// protocol and port (protocol<<16 | port, the compact path's packing), and
// its answer: the index of its deciding policy in the batch's and whether
// it is a DENY.
type IdentityFlow struct {
	Src, Dst *inventory.TagSet
	PP       uint32
	Policy   uint32
	Deny     bool
}

// identityGroup is how many flows IdentitiesN reads ahead of counting them.
const identityGroup = 16

// IdentitiesN counts the flows fs, decided at revision rev by policies: as
// Identities one by one, but with the cache lines of a group of flows read
// before any of them is counted, so that their misses overlap instead of
// following one another (as the pair memo's ProbeN does).
func (b *Batch) IdentitiesN(fs []IdentityFlow, policies []string, rev int64) {
	var sink uintptr
	for i := 0; i < len(fs); i += identityGroup {
		g := fs[i:min(i+identityGroup, len(fs))]
		var sis [identityGroup]uint32
		var fps [identityGroup]uint16
		for j := range g {
			sis[j], fps[j] = setOf(g[j].Src, g[j].Dst, g[j].PP)
			sink += uintptr(b.s.tags[sis[j]][0])
		}
		for j := range g {
			w := 0
			for k, tg := range &b.s.tags[sis[j]] {
				if tg == fps[j] {
					w = k
					break
				}
			}
			sink += uintptr(b.s.slots[sis[j]][w].pp)
		}
		for j := range g {
			f := &g[j]
			action := finalAction(f.Deny)
			b.count(f.Src, f.Dst, f.PP, sis[j], fps[j], action, policies[f.Policy], rev)
		}
	}
	b.sink = sink // the reads above are kept
}

// setOf is the set of a stripe that holds a flow, and the flow's
// fingerprint there (never 0, which marks an empty way).
func setOf(src, dst *inventory.TagSet, pp uint32) (uint32, uint16) {
	h := uint64(uintptr(unsafe.Pointer(src)))*0x9E3779B97F4A7C15 ^ uint64(uintptr(unsafe.Pointer(dst)))*0xC2B2AE3D27D4EB4F ^
		uint64(pp)*0x165667B19E3779F9
	return uint32(h >> (64 - stripeSetBits)), uint16(h>>32) | 1
}

// count counts one decision of the flow (src, dst, pp) of set si and
// fingerprint fp.
func (b *Batch) count(src, dst *inventory.TagSet, pp, si uint32, fp uint16, action resource.Action, policy string, rev int64) {
	if len(policy) > maxPolicyLen {
		sl := slot{src: src, dst: dst, mt: b.mt, pp: pp, count: 1, first: b.now, last: b.now, rev: rev}
		b.t.flushSlotPolicy(&sl, action, policy)
		return
	}
	meta := uint32(len(policy))<<8 | uint32(action)
	tags := &b.s.tags[si]
	for w, tg := range tags {
		if tg != fp {
			continue
		}
		sl := &b.s.slots[si][w]
		if sl.src == src && sl.dst == dst && sl.pp == pp && sl.mt == b.mt {
			if sl.count == math.MaxUint32 { // to the table, and counted afresh
				b.t.flushSlot(sl)
				*sl = slot{src: src, dst: dst, mt: b.mt, pp: pp, count: 1, meta: meta, policy: unsafe.StringData(policy),
					first: b.now, last: b.now, rev: rev}
				return
			}
			sl.count++
			sl.last, sl.meta, sl.policy, sl.rev = b.now, meta, unsafe.StringData(policy), rev
			return
		}
	}
	w := -1
	for i, tg := range tags {
		if tg == 0 {
			w = i
			break
		}
	}
	if w < 0 {
		w = int(b.s.next[si] % stripeWays)
		b.s.next[si]++
		b.t.flushSlot(&b.s.slots[si][w])
	}
	tags[w] = fp
	b.s.slots[si][w] = slot{src: src, dst: dst, mt: b.mt, pp: pp, count: 1, meta: meta, policy: unsafe.StringData(policy),
		first: b.now, last: b.now, rev: rev}
}

// flushSlot empties a slot into the table.
func (t *Table) flushSlot(sl *slot) {
	if sl.src == nil {
		return
	}
	t.flushSlotPolicy(sl, resource.Action(sl.meta&0xff), unsafe.String(sl.policy, sl.meta>>8))
	*sl = slot{}
}

// flushSlotPolicy adds a slot's counts to the table with the given answer.
func (t *Table) flushSlotPolicy(sl *slot, action resource.Action, policy string) {
	src, dst := identityEnd(sl.src), identityEnd(sl.dst)
	t.add(sl.mt, &src, &dst, sl.pp, uint64(sl.count), sl.first, sl.last, action, policy, sl.rev)
}

// identityEnd is the end a compact flow names by the identity of its tag set.
func identityEnd(s *inventory.TagSet) End {
	return End{Given: inventory.Endpoint{Identity: s.Identity()}, Identity: s.Identity(), Tags: s.Tags()}
}

// finalAction is the action of an answer that is a DENY or not.
func finalAction(deny bool) resource.Action {
	if deny {
		return resource.Deny
	}
	return resource.Allow
}

// flush empties every stripe's cache and registered entries into the table.
func (t *Table) flush() {
	t.takeTallied()
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		for si := range s.slots {
			for w := range s.slots[si] {
				t.flushSlot(&s.slots[si][w])
				s.tags[si][w] = 0
			}
		}
		s.mu.Unlock()
	}
}

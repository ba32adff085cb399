package observed

import (
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

const (
	stripeSetBits = 12
	stripeSets    = 1 << stripeSetBits
	stripeWays    = 4
)

type stripe struct {
	mu   sync.Mutex
	sets [stripeSets][stripeWays]slot
	next [stripeSets]uint8 // the way a set replaces next
	_    [64]byte
}

// slot counts one flow between identities since the slot took it.
type slot struct {
	src, dst    *inventory.TagSet // nil: empty
	mt, pp      uint32
	count       uint64
	first, last int64
	rev         int64
	policy      string
	action      resource.Action
}

// Batch counts the flows of one compact batch (one mesh and type) into a
// stripe it holds until Done.
type Batch struct {
	t   *Table
	s   *stripe
	mt  uint32
	now int64
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

// Identities counts one decision of a flow between the tag sets src and
// dst (as given: their identities), whose answer is (action, policy) at
// revision rev.
func (b *Batch) Identities(src, dst *inventory.TagSet, proto resource.Protocol, port uint32, action resource.Action, policy string, rev int64) {
	pp := packPort(proto, port)
	h := uint64(uintptr(unsafe.Pointer(src)))*0x9E3779B97F4A7C15 ^ uint64(uintptr(unsafe.Pointer(dst)))*0xC2B2AE3D27D4EB4F ^
		uint64(pp)*0x165667B19E3779F9
	si := h >> (64 - stripeSetBits)
	set := &b.s.sets[si]
	for w := range set {
		sl := &set[w]
		if sl.src == src && sl.dst == dst && sl.pp == pp && sl.mt == b.mt {
			sl.count++
			sl.last, sl.action, sl.policy, sl.rev = b.now, action, policy, rev
			return
		}
	}
	w := -1
	for i := range set {
		if set[i].src == nil {
			w = i
			break
		}
	}
	if w < 0 {
		w = int(b.s.next[si] % stripeWays)
		b.s.next[si]++
		b.t.flushSlot(&set[w])
	}
	set[w] = slot{src: src, dst: dst, mt: b.mt, pp: pp, count: 1, first: b.now, last: b.now, rev: rev, policy: policy, action: action}
}

// flushSlot empties a slot into the table.
func (t *Table) flushSlot(sl *slot) {
	if sl.src == nil {
		return
	}
	src := End{Given: inventory.Endpoint{Identity: sl.src.Identity()}, Identity: sl.src.Identity(), Tags: sl.src.Tags()}
	dst := End{Given: inventory.Endpoint{Identity: sl.dst.Identity()}, Identity: sl.dst.Identity(), Tags: sl.dst.Tags()}
	t.add(sl.mt, &src, &dst, sl.pp, sl.count, sl.first, sl.last, sl.action, sl.policy, sl.rev)
	*sl = slot{}
}

// flush empties every stripe's cache into the table.
func (t *Table) flush() {
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		for si := range s.sets {
			for w := range s.sets[si] {
				t.flushSlot(&s.sets[si][w])
			}
		}
		s.mu.Unlock()
	}
}

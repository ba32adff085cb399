package memo

import (
	"hash/maphash"
	"math/rand/v2"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The decision cache (the memo). Sidecars ask about the same flows over and
// over; the engine remembers its answers, keyed by the whole flow (mesh, type,
// both tag sets, protocol, port), so a repeated flow costs a hash and a check
// instead of a scan. The tag sets are keyed whole, reserved keys (ip,
// principal) included: an identity leaves them out, but selectors read them,
// so two flows whose tags differ only in ip never share an entry. A flow
// between interned tag sets (identity.go) brings the sets' hashes, so a hit
// costs no pass over its tags, and a pointer compare verifies them.
//
// The memo outlives snapshots: Apply hands it to the next snapshot, and every
// entry carries the epoch of the (mesh, type) partition it was computed in. A
// partition's epoch is renewed whenever its answers may change — a policy of
// its type (typeState.apply, buildType), a Mesh or Scope change (rebuildMesh:
// every type of the mesh) — and is kept by the changes that cannot alter them:
// a workload put, a policy of another type, a change in another mesh. An entry
// of another epoch is a miss, and its slot is the first one the new answer
// takes. Invalid stored resources close a partition before the memo is asked
// (closedByType). A hit answers with the asking snapshot's revision.
//
// It is lock-free: fixed arrays of atomic words. A flow's hash picks two
// buckets of 8 slots each (two choices: the cache fills to ~100% before flows
// are lost to crowded buckets); a bucket's hashes sit in one cache line, so a
// lookup reads one or two lines and follows a pointer only on a hash match. A hit is verified against the request field by field, so a hash
// collision costs a miss, never a wrong answer. An entry is stored only for a
// flow seen twice (a "doorkeeper" Bloom filter remembers flows seen once, and
// starts over after 64k of them), so traffic
// that never repeats allocates nothing; repeated traffic allocates once per flow.
//
// Eviction is least-frequently-used within the bucket, with aging: every entry
// counts its hits (saturating at 15); a new flow replaces the entry with the
// fewest hits of its two buckets, and every 8th replacement in a bucket halves its counts, so a flow
// that stops coming leaves. Flows that keep coming stay: cycling over more flows
// than the cache holds, the resident ones keep hitting and the others take turns
// in a few slots, instead of every flow evicting another (which gives an LRU
// cache no hits at all on a cycle larger than itself).
//
// A lineage's epochs follow each other: an entry of an older epoch will never
// answer again, so the new answer takes its slot. Snapshots read at past
// revisions share a memo whose epochs do not follow each other — one flow is
// asked at revision 120, then 135, then 120 again — and there the in-place
// replacement would have each revision evict the other's answer on every
// call. Such a memo is keyed by epoch (Holder.KeyByEpoch): the epoch's salt is
// mixed into the flow's hash, so each epoch's answer of a flow has its own
// slot, and those no revision asks again age out as any other entry does.
//
// A flow asked at many past revisions mostly gets one answer at all of them:
// a change of its partition seldom touches the rules that decide it. So in a
// memo keyed by epoch, a flow's entries share their answer and their tag
// lists when the answers are equal (the caller's equality, given to
// KeyByEpoch): a new entry looks at the last one stored for its flow in any
// epoch (homes, indexed by the unsalted flow hash) and points at its answer
// when it is the same. An entry then costs a hit its own cache lines and those
// of an answer many revisions read, which stays in the CPU's caches; a caller
// cycling over a thousand revisions reads a thousand small entries, not a
// thousand copies of the answer. Sharing never changes what an entry answers:
// only equal answers are shared, and a hit still verifies its entry's epoch.

const (
	cacheWays     = 8
	cacheBuckets  = 1 << 11
	cacheSlots    = cacheWays * cacheBuckets // entries
	cacheSeenBits = 1 << 18                  // doorkeeper bits
	cacheSeenMax  = 1 << 16                  // flows the doorkeeper remembers before it starts over
	cacheMaxHits  = 15
)

// Cache is the decision memo of a lineage of snapshots, for answers of type D.
type Cache[D any] struct {
	byEpoch bool // entries are keyed by epoch as well as flow (Holder.KeyByEpoch); set at creation
	// same reports equal answers, and homes holds the last entry stored per
	// unsalted flow hash: set with byEpoch, for entries to share answers.
	same   func(a, b *D) bool
	homes  *[cacheBuckets]atomic.Pointer[Entry[D]]
	seen   [cacheSeenBits / 64]atomic.Uint64 // a Bloom filter of flows seen once: two bits per flow
	seenN  atomic.Uint32
	misses atomic.Uint64 // lookups that found no entry (tests read it: a counter, not a timing)
	// pairMisses counts identity-pair memo lookups that missed (pairmemo.go).
	pairMisses atomic.Uint64
	buckets    [cacheBuckets]bucket[D]
}

// Epoch marks the answers of one (mesh, type) partition: entries computed
// under another epoch are stale. Compared by pointer; never zero-sized, so two
// epochs never share an address. It holds the partition's identity-pair memo
// (pairmemo.go), created on first use, so a new epoch starts without one.
type Epoch[D any] struct {
	pairs atomic.Pointer[Pairs[D]]
	salt  atomic.Uint64 // mixed into flows' hashes by a memo keyed by epoch; 0 until first asked
}

// saltOf returns the epoch's salt, drawn on first use: random, so that the
// epochs of one flow spread over the buckets; never 0.
func (e *Epoch[D]) saltOf() uint64 {
	if s := e.salt.Load(); s != 0 {
		return s
	}
	e.salt.CompareAndSwap(0, rand.Uint64()|1)
	return e.salt.Load()
}

// Holder is the memo shared by a lineage of snapshots (Build, then Apply
// after Apply); created on first use.
type Holder[D any] struct {
	c       atomic.Pointer[Cache[D]]
	byEpoch bool
	same    func(a, b *D) bool
}

// KeyByEpoch makes the memo h creates keyed by epoch as well as flow, for
// snapshots whose epochs do not follow each other (the past's); a flow's
// entries of several epochs share an answer that same says is equal (nil:
// none share). Call it before the first Get.
func (h *Holder[D]) KeyByEpoch(same func(a, b *D) bool) { h.byEpoch, h.same = true, same }

// Key is what a lookup or a store is keyed and verified by.
type Key[D any] struct {
	H          uint64 // FlowHashOf the flow
	Epoch      *Epoch[D]
	Mesh, Type string
	Flow       index.Flow        // by value: a pointer here would make every flow escape (escape analysis is field-insensitive)
	Src, Dst   *inventory.TagSet // the flow's interned tag sets, when the caller has them
}

type bucket[D any] struct {
	hashes  [cacheWays]atomic.Uint64 // 0: empty
	slots   [cacheWays]atomic.Pointer[Entry[D]]
	evicted atomic.Uint32
}

// Entry is one remembered answer. Never modified once stored, but for its
// hit count. What a hit reads comes first.
type Entry[D any] struct {
	hash     uint64
	epoch    *Epoch[D]
	srcSet   *inventory.TagSet // the interned sets the entry was stored with, if any: a pointer compare verifies them
	dstSet   *inventory.TagSet
	proto    resource.Protocol
	port     uint32
	hits     atomic.Uint32
	mesh     string
	typ      string
	src, dst []index.TagKV // shared with the flow's other entries (read only)
	d        *D            // the answer: the entry's own (withAnswer), or shared with another of its flow
	// ids are the identities of the source's and the destination's tags in
	// mesh (Identity), computed once when the entry is made: a hit reports
	// them without hashing the tags again (Decide).
	ids [2]uint64
}

// withAnswer is an entry and its own answer in one allocation.
type withAnswer[D any] struct {
	e Entry[D]
	d D
}

// FlowHash is the hash a flow is remembered by.
func FlowHash(mesh, typ string, f *index.Flow) uint64 {
	return FlowHashOf(mesh, typ, inventory.TagsHash(f.Src), inventory.TagsHash(f.Dst), f.Proto, f.Port)
}

// FlowHashOf is FlowHash from the tag sets' hashes (inventory.TagsHash).
func FlowHashOf(mesh, typ string, src, dst uint64, proto resource.Protocol, port uint32) uint64 {
	h := maphash.String(inventory.CacheSeed, mesh) ^ inventory.Mix64(maphash.String(inventory.CacheSeed, typ))
	h ^= inventory.Mix64(src + 0x632BE59BD9B4E019)
	h ^= inventory.Mix64(dst*3 + 0x8CB92BA72F3D8DD7)
	h ^= inventory.Mix64(uint64(proto)<<32 | uint64(port))
	return h | 1<<63 // never 0: 0 marks an empty slot
}

// sameTags reports whether a request's tags are exactly the entry's.
func sameTags(want []index.TagKV, tags resource.Tags) bool {
	if len(want) != len(tags) {
		return false
	}
	for _, kv := range want {
		if v, ok := tags[kv.K]; !ok || v != kv.V {
			return false
		}
	}
	return true
}

// hashOf is the hash k's flow sits under: its flow hash, with the epoch's
// salt mixed in when the memo is keyed by epoch.
func (c *Cache[D]) hashOf(k *Key[D]) uint64 {
	if !c.byEpoch {
		return k.H
	}
	return (k.H ^ inventory.Mix64(k.Epoch.saltOf())) | 1<<63
}

// buckets returns the two buckets a flow may sit in.
func (c *Cache[D]) bucketsOf(h uint64) [2]*bucket[D] {
	return [2]*bucket[D]{&c.buckets[h&(cacheBuckets-1)], &c.buckets[(h>>22)&(cacheBuckets-1)]}
}

// Lookup returns the entry of k's flow in k's epoch, if the memo holds it.
func (c *Cache[D]) Lookup(k *Key[D]) (*Entry[D], bool) {
	h := c.hashOf(k)
	bs := c.bucketsOf(h)
	if e := bs[0].lookup(k, h); e != nil {
		return e, true
	}
	if e := bs[1].lookup(k, h); e != nil {
		return e, true
	}
	c.misses.Add(1)
	return nil, false
}

// sameFlow reports whether e holds the answer of exactly k's flow, stored
// under hash h (Cache.hashOf).
func (e *Entry[D]) sameFlow(k *Key[D], h uint64) bool {
	return e.hash == h && e.isFlow(k)
}

// isFlow reports whether e is of exactly k's flow, in any epoch.
func (e *Entry[D]) isFlow(k *Key[D]) bool {
	f := &k.Flow
	return e.mesh == k.Mesh && e.typ == k.Type && e.proto == f.Proto && e.port == f.Port &&
		(e.srcSet != nil && e.srcSet == k.Src || sameTags(e.src, f.Src)) &&
		(e.dstSet != nil && e.dstSet == k.Dst || sameTags(e.dst, f.Dst))
}

func (b *bucket[D]) lookup(k *Key[D], h uint64) *Entry[D] {
	for i := range b.hashes {
		if b.hashes[i].Load() != h {
			continue
		}
		e := b.slots[i].Load()
		if e == nil || e.epoch != k.Epoch || !e.sameFlow(k, h) {
			continue
		}
		if n := e.hits.Load(); n < cacheMaxHits {
			e.hits.Store(n + 1) // a lost increment only ages the entry a little sooner
		}
		return e
	}
	return nil
}

// Store remembers d for the flow if the flow was seen before, and returns the
// entry stored (nil: seen once so far). An entry of the same flow from an
// older epoch is replaced in place (in a memo keyed by epoch, the epochs'
// hashes differ, so it is not found). Entries are never modified once stored
// (but for their hit counts).
func (c *Cache[D]) Store(k *Key[D], d *D) *Entry[D] {
	h, f := c.hashOf(k), &k.Flow
	for _, cb := range c.bucketsOf(h) {
		for i := range cb.hashes {
			if cb.hashes[i].Load() != h {
				continue
			}
			if old := cb.slots[i].Load(); old != nil && old.epoch != k.Epoch && old.sameFlow(k, h) {
				e := newEntry(k, h, d, nil)
				e.src, e.dst, e.ids = old.src, old.dst, old.ids
				e.hits.Store(old.hits.Load())
				cb.slots[i].Store(e) // the same flow, hash unchanged: readers verify the epoch
				return e
			}
		}
	}
	b1, b2 := (h>>11)&(cacheSeenBits-1), (h>>37)&(cacheSeenBits-1)
	w1, w2 := &c.seen[b1/64], &c.seen[b2/64]
	m1, m2 := uint64(1)<<(b1%64), uint64(1)<<(b2%64)
	if w1.Load()&m1 == 0 || w2.Load()&m2 == 0 {
		if c.seenN.Add(1)%cacheSeenMax == 0 {
			for i := range c.seen {
				c.seen[i].Store(0)
			}
		}
		w1.Or(m1)
		w2.Or(m2)
		return nil
	}
	sib, home := c.sibling(k)
	var e *Entry[D]
	if sib != nil && c.same(sib.d, d) {
		e = newEntry(k, h, nil, sib.d)
	} else {
		e = newEntry(k, h, d, nil)
	}
	if sib != nil {
		e.src, e.dst, e.ids = sib.src, sib.dst, sib.ids
	} else {
		e.src, e.dst = make([]index.TagKV, 0, len(f.Src)), make([]index.TagKV, 0, len(f.Dst))
		for k, v := range f.Src {
			e.src = append(e.src, index.TagKV{K: k, V: v})
		}
		for k, v := range f.Dst {
			e.dst = append(e.dst, index.TagKV{K: k, V: v})
		}
		e.ids = [2]uint64{setIdentity(k.Mesh, k.Src, f.Src), setIdentity(k.Mesh, k.Dst, f.Dst)}
	}
	if home != nil {
		home.Store(e)
	}
	var b *bucket[D]
	victim, fewest := -1, uint32(cacheMaxHits+1)
pick:
	for _, cb := range c.bucketsOf(h) {
		for i := range cb.slots {
			old := cb.slots[i].Load()
			if old == nil {
				b, victim = cb, i
				break pick
			}
			if n := old.hits.Load(); n < fewest {
				b, victim, fewest = cb, i, n
			}
		}
	}
	if b.slots[victim].Load() != nil && b.evicted.Add(1)%cacheWays == 0 {
		for i := range b.slots {
			if old := b.slots[i].Load(); old != nil {
				old.hits.Store(old.hits.Load() / 2)
			}
		}
	}
	// The slot's hash is cleared while its entry changes, so a reader that sees
	// the new hash finds the new entry (and verifies it in any case).
	b.hashes[victim].Store(0)
	b.slots[victim].Store(e)
	b.hashes[victim].Store(h)
	return e
}

// newEntry is an entry of k's flow stored under hash h, with its own copy of
// the answer d, or sharing the answer shared (d nil); its tag lists and
// identities are the caller's to set.
func newEntry[D any](k *Key[D], h uint64, d, shared *D) *Entry[D] {
	var e *Entry[D]
	if shared != nil {
		e = &Entry[D]{d: shared}
	} else {
		own := &withAnswer[D]{d: *d}
		e = &own.e
		e.d = &own.d
	}
	e.hash, e.epoch, e.srcSet, e.dstSet, e.mesh, e.typ = h, k.Epoch, k.Src, k.Dst, k.Mesh, k.Type
	e.proto, e.port = k.Flow.Proto, k.Flow.Port
	return e
}

// sibling is the entry last stored for k's flow in any epoch, whose answer
// and tag lists a new entry may share, and the slot of homes the new entry
// takes; nil, nil when the memo is not keyed by epoch. A flow has two slots
// (its unsalted hash picks them as it picks buckets): it takes one that holds
// it or nothing, else the first.
func (c *Cache[D]) sibling(k *Key[D]) (*Entry[D], *atomic.Pointer[Entry[D]]) {
	if c.homes == nil {
		return nil, nil
	}
	slots := [2]*atomic.Pointer[Entry[D]]{&c.homes[k.H&(cacheBuckets-1)], &c.homes[(k.H>>22)&(cacheBuckets-1)]}
	for _, slot := range slots {
		if sib := slot.Load(); sib != nil && sib.isFlow(k) {
			return sib, slot
		}
	}
	for _, slot := range slots {
		if slot.Load() == nil {
			return nil, slot
		}
	}
	return nil, slots[0]
}

// setIdentity is the identity of tags in mesh: the interned set's when the
// caller has it (set, of tags), else computed.
func setIdentity(mesh string, set *inventory.TagSet, tags resource.Tags) uint64 {
	if set != nil {
		return set.Identity()
	}
	return resource.Identity(mesh, tags)
}

// Answer is the entry's answer, shared by every reader: read only.
func (e *Entry[D]) Answer() *D { return e.d }

// IDs are the identities of the flow's source and destination tag sets.
func (e *Entry[D]) IDs() [2]uint64 { return e.ids }

// Misses counts the lookups that found no entry (tests read it: a counter,
// not a timing).
func (c *Cache[D]) Misses() uint64 { return c.misses.Load() }

// Get returns the memo of the lineage, creating it on first use.
func (h *Holder[D]) Get() *Cache[D] {
	if c := h.c.Load(); c != nil {
		return c
	}
	c := &Cache[D]{byEpoch: h.byEpoch}
	if h.byEpoch && h.same != nil {
		c.same, c.homes = h.same, new([cacheBuckets]atomic.Pointer[Entry[D]])
	}
	if h.c.CompareAndSwap(nil, c) {
		return c
	}
	return h.c.Load()
}

// PairMiss counts a miss of an identity-pair memo and returns the count.
func (c *Cache[D]) PairMiss() uint64 { return c.pairMisses.Add(1) }

// PairMisses counts the identity-pair memo lookups that missed (tests).
func (c *Cache[D]) PairMisses() uint64 { return c.pairMisses.Load() }

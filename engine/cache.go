package engine

import (
	"hash/maphash"
	"sync/atomic"
)

// The decision cache. Sidecars ask about the same flows over and over; a
// snapshot remembers its answers, keyed by the whole flow (mesh, type, both tag
// sets, protocol, port), so a repeated flow costs a hash and a check instead of
// a scan. The cache belongs to the snapshot: a change makes a new snapshot with
// an empty cache, so it can never answer from an older revision.
//
// It is lock-free: fixed arrays of atomic pointers, direct-mapped by hash. A
// hit is verified against the request field by field, so a hash collision
// costs a miss, never a wrong answer. An entry is stored only for a flow seen
// twice (a "doorkeeper" array remembers hashes seen once), so traffic that never
// repeats allocates nothing; repeated traffic allocates once per flow.

const (
	cacheSlots = 1 << 14 // entries
	cacheSeen  = 1 << 15 // doorkeeper hashes
)

type decisionCache struct {
	seen  [cacheSeen]atomic.Uint64
	slots [cacheSlots]atomic.Pointer[cacheEntry]
}

type cacheEntry struct {
	hash     uint64
	mesh     string
	typ      string
	proto    Protocol
	port     uint32
	src, dst []tagKV
	d        Decision
}

var cacheSeed = maphash.MakeSeed()

func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// tagsHash hashes a tag set independently of map order.
func tagsHash(tags Tags) uint64 {
	var sum uint64
	for k, v := range tags {
		sum += mix64(maphash.String(cacheSeed, k) ^ maphash.String(cacheSeed, v)*0x9E3779B97F4A7C15)
	}
	return sum + uint64(len(tags))
}

func flowHash(mesh, typ string, f *flow) uint64 {
	h := maphash.String(cacheSeed, mesh) ^ mix64(maphash.String(cacheSeed, typ))
	h ^= mix64(tagsHash(f.src) + 0x632BE59BD9B4E019)
	h ^= mix64(tagsHash(f.dst)*3 + 0x8CB92BA72F3D8DD7)
	h ^= mix64(uint64(f.proto)<<32 | uint64(f.port))
	return h
}

// sameTags reports whether a request's tags are exactly the entry's.
func sameTags(want []tagKV, tags Tags) bool {
	if len(want) != len(tags) {
		return false
	}
	for _, kv := range want {
		if v, ok := tags[kv.k]; !ok || v != kv.v {
			return false
		}
	}
	return true
}

// Two slots per hash (2-way associative): flows whose first slots collide
// still both stay cached.
func slotsOf(h uint64) (uint64, uint64) { return h & (cacheSlots - 1), (h >> 32) & (cacheSlots - 1) }

func (c *decisionCache) lookup(h uint64, mesh, typ string, f *flow) (Decision, bool) {
	i1, i2 := slotsOf(h)
	e := c.slots[i1].Load()
	if e == nil || e.hash != h {
		if e = c.slots[i2].Load(); e == nil || e.hash != h {
			return Decision{}, false
		}
	}
	if e.mesh != mesh || e.typ != typ || e.proto != f.proto || e.port != f.port ||
		!sameTags(e.src, f.src) || !sameTags(e.dst, f.dst) {
		return Decision{}, false
	}
	return e.d, true
}

// store remembers d for the flow if the flow was seen before.
func (c *decisionCache) store(h uint64, mesh, typ string, f *flow, d Decision) {
	d1, d2 := &c.seen[h&(cacheSeen-1)], &c.seen[(h>>40)&(cacheSeen-1)]
	if d1.Load() != h && d2.Load() != h {
		if d1.Load() == 0 || h&(1<<30) != 0 {
			d1.Store(h)
		} else {
			d2.Store(h)
		}
		return
	}
	e := &cacheEntry{hash: h, mesh: mesh, typ: typ, proto: f.proto, port: f.port, d: d,
		src: make([]tagKV, 0, len(f.src)), dst: make([]tagKV, 0, len(f.dst))}
	for k, v := range f.src {
		e.src = append(e.src, tagKV{k, v})
	}
	for k, v := range f.dst {
		e.dst = append(e.dst, tagKV{k, v})
	}
	i1, i2 := slotsOf(h)
	switch {
	case c.slots[i1].Load() == nil:
		c.slots[i1].Store(e)
	case c.slots[i2].Load() == nil:
		c.slots[i2].Store(e)
	case h&(1<<31) != 0:
		c.slots[i1].Store(e)
	default:
		c.slots[i2].Store(e)
	}
}

// cache returns the snapshot's decision cache, creating it on first use.
func (s *Snapshot) cache() *decisionCache {
	if c := s.decisions.Load(); c != nil {
		return c
	}
	c := &decisionCache{}
	if s.decisions.CompareAndSwap(nil, c) {
		return c
	}
	return s.decisions.Load()
}

// Package pmap is a persistent hash map (a hash array mapped trie): Set and
// Delete return a new map that shares every untouched node with the old one, so
// an update costs O(log32 n) and old versions stay valid and unchanged. It is
// what lets the engine build the next snapshot in time proportional to the
// change while readers keep using the previous one without locks.
//
// A Builder batches many updates: nodes it created itself are changed in place,
// nodes shared with earlier versions are copied once. A Map is safe for
// concurrent readers; a Builder is for one goroutine.
package pmap

import (
	"hash/maphash"
	"math/bits"
)

const (
	bitsPerLevel = 5
	fanout       = 1 << bitsPerLevel
	mask         = fanout - 1
	maxShift     = 60 // below this depth nodes branch; at it they hold colliding entries
)

// Map is an immutable map from K to V. The zero Map is not usable; use New.
type Map[K comparable, V any] struct {
	root *node[K, V]
	size int
	hash func(K) uint64
}

type node[K comparable, V any] struct {
	bitmap  uint32
	entries []entry[K, V]
	edit    *edit
}

// An entry keeps no hash of its key: a lookup compares the key itself (what a
// hit does anyway), and only a slot two keys share needs the hash again, to
// push them down (a node's copy is what an update pays per level, and every
// entry of every map is memory held).
type entry[K comparable, V any] struct {
	key   K
	val   V
	child *node[K, V]
}

type edit struct{ open bool }

// Nodes are allocated together with their entries (in size classes), so a
// lookup touches one allocation per level, not two: at 100k keys that is half
// the cache misses.
type (
	node1[K comparable, V any] struct {
		n   node[K, V]
		buf [1]entry[K, V]
	}
	node2[K comparable, V any] struct {
		n   node[K, V]
		buf [2]entry[K, V]
	}
	node4[K comparable, V any] struct {
		n   node[K, V]
		buf [4]entry[K, V]
	}
	node8[K comparable, V any] struct {
		n   node[K, V]
		buf [8]entry[K, V]
	}
	node16[K comparable, V any] struct {
		n   node[K, V]
		buf [16]entry[K, V]
	}
	node32[K comparable, V any] struct {
		n   node[K, V]
		buf [32]entry[K, V]
	}
)

// newNode returns an empty node owned by e with room for at least size entries.
func newNode[K comparable, V any](e *edit, size int) *node[K, V] {
	switch {
	case size <= 1:
		x := &node1[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	case size <= 2:
		x := &node2[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	case size <= 4:
		x := &node4[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	case size <= 8:
		x := &node8[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	case size <= 16:
		x := &node16[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	case size <= 32:
		x := &node32[K, V]{}
		x.n.entries, x.n.edit = x.buf[:0], e
		return &x.n
	}
	return &node[K, V]{edit: e, entries: make([]entry[K, V], 0, size)}
}

// grown returns n, or a copy of it (owned by e) with room for one more entry.
func grown[K comparable, V any](e *edit, n *node[K, V]) *node[K, V] {
	if len(n.entries) < cap(n.entries) {
		return n
	}
	c := newNode[K, V](e, len(n.entries)+1)
	c.bitmap = n.bitmap
	c.entries = append(c.entries, n.entries...)
	return c
}

// New returns an empty map hashing keys with hash.
func New[K comparable, V any](hash func(K) uint64) Map[K, V] {
	return Map[K, V]{hash: hash}
}

var seed = maphash.MakeSeed()

// StringHash hashes strings; pass it to New for maps keyed by string.
func StringHash(s string) uint64 { return maphash.String(seed, s) }

// Len returns the number of entries.
func (m Map[K, V]) Len() int { return m.size }

// Get returns the value for k.
func (m Map[K, V]) Get(k K) (V, bool) {
	var zero V
	if m.root == nil {
		return zero, false
	}
	return m.GetHashed(k, m.hash(k))
}

// GetHashed is Get with the key's hash computed by the caller.
func (m Map[K, V]) GetHashed(k K, h uint64) (V, bool) {
	n := m.root
	for shift := uint(0); n != nil; shift += bitsPerLevel {
		if shift >= maxShift {
			for i := range n.entries {
				if n.entries[i].key == k {
					return n.entries[i].val, true
				}
			}
			break
		}
		bit := uint32(1) << ((h >> shift) & mask)
		if n.bitmap&bit == 0 {
			break
		}
		e := &n.entries[bits.OnesCount32(n.bitmap&(bit-1))]
		if e.child != nil {
			n = e.child
			continue
		}
		if e.key == k {
			return e.val, true
		}
		break
	}
	var zero V
	return zero, false
}

// Range calls f for every entry, in no particular order, until f returns false.
func (m Map[K, V]) Range(f func(K, V) bool) {
	if m.root != nil {
		m.root.each(f)
	}
}

func (n *node[K, V]) each(f func(K, V) bool) bool {
	for i := range n.entries {
		e := &n.entries[i]
		if e.child != nil {
			if !e.child.each(f) {
				return false
			}
			continue
		}
		if !f(e.key, e.val) {
			return false
		}
	}
	return true
}

// Set returns a map with k set to v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	b := m.Builder()
	b.Set(k, v)
	return b.Map()
}

// Delete returns a map without k.
func (m Map[K, V]) Delete(k K) Map[K, V] {
	b := m.Builder()
	b.Delete(k)
	return b.Map()
}

// Builder batches updates to a map; see the package comment.
type Builder[K comparable, V any] struct {
	m    Map[K, V]
	edit *edit
}

// Builder starts a batch of updates on m; m itself never changes.
func (m Map[K, V]) Builder() *Builder[K, V] {
	return &Builder[K, V]{m: m, edit: &edit{open: true}}
}

// Len returns the number of entries the map has now.
func (b *Builder[K, V]) Len() int { return b.m.size }

// Get reads the map as the builder has it now.
func (b *Builder[K, V]) Get(k K) (V, bool) { return b.m.Get(k) }

// Map ends the batch and returns the new map. The builder must not be used after.
func (b *Builder[K, V]) Map() Map[K, V] {
	b.edit.open = false
	return b.m
}

func (b *Builder[K, V]) owned(n *node[K, V]) *node[K, V] {
	if n.edit == b.edit {
		return n
	}
	c := newNode[K, V](b.edit, len(n.entries))
	c.bitmap = n.bitmap
	c.entries = append(c.entries, n.entries...)
	return c
}

// Set sets k to v.
func (b *Builder[K, V]) Set(k K, v V) {
	h := b.m.hash(k)
	if b.m.root == nil {
		b.m.root = newNode[K, V](b.edit, 1)
	}
	var added bool
	b.m.root = b.set(b.m.root, 0, h, k, v, &added)
	if added {
		b.m.size++
	}
}

func (b *Builder[K, V]) set(n *node[K, V], shift uint, h uint64, k K, v V, added *bool) *node[K, V] {
	if shift >= maxShift {
		n = b.owned(n)
		for i := range n.entries {
			if n.entries[i].key == k {
				n.entries[i].val = v
				return n
			}
		}
		n = grown(b.edit, n)
		n.entries = append(n.entries, entry[K, V]{key: k, val: v})
		*added = true
		return n
	}
	bit := uint32(1) << ((h >> shift) & mask)
	idx := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		n = grown(b.edit, b.owned(n))
		n.entries = append(n.entries, entry[K, V]{})
		copy(n.entries[idx+1:], n.entries[idx:])
		n.entries[idx] = entry[K, V]{key: k, val: v}
		n.bitmap |= bit
		*added = true
		return n
	}
	e := n.entries[idx]
	switch {
	case e.child != nil:
		child := b.set(e.child, shift+bitsPerLevel, h, k, v, added)
		if child != e.child {
			n = b.owned(n)
			n.entries[idx].child = child
		}
		return n
	case e.key == k:
		n = b.owned(n)
		n.entries[idx].val = v
		return n
	default:
		// Two keys share this slot: push both one level down.
		child := newNode[K, V](b.edit, 2)
		var ignore bool
		child = b.set(child, shift+bitsPerLevel, b.m.hash(e.key), e.key, e.val, &ignore)
		child = b.set(child, shift+bitsPerLevel, h, k, v, added)
		n = b.owned(n)
		n.entries[idx] = entry[K, V]{child: child}
		return n
	}
}

// Delete removes k.
func (b *Builder[K, V]) Delete(k K) {
	if b.m.root == nil {
		return
	}
	h := b.m.hash(k)
	var removed bool
	root := b.del(b.m.root, 0, h, k, &removed)
	if !removed {
		return
	}
	b.m.size--
	if root == nil {
		root = newNode[K, V](b.edit, 1)
	}
	b.m.root = root
}

// del returns the node without k; nil when the node became empty.
func (b *Builder[K, V]) del(n *node[K, V], shift uint, h uint64, k K, removed *bool) *node[K, V] {
	if shift >= maxShift {
		for i := range n.entries {
			if n.entries[i].key == k {
				*removed = true
				if len(n.entries) == 1 {
					return nil
				}
				n = b.owned(n)
				n.entries = append(n.entries[:i], n.entries[i+1:]...)
				return n
			}
		}
		return n
	}
	bit := uint32(1) << ((h >> shift) & mask)
	if n.bitmap&bit == 0 {
		return n
	}
	idx := bits.OnesCount32(n.bitmap & (bit - 1))
	e := n.entries[idx]
	if e.child != nil {
		child := b.del(e.child, shift+bitsPerLevel, h, k, removed)
		if !*removed {
			return n
		}
		if child == nil {
			return b.removeSlot(n, idx, bit)
		}
		// A child left with one plain entry folds back into this node.
		if len(child.entries) == 1 && child.entries[0].child == nil {
			n = b.owned(n)
			n.entries[idx] = child.entries[0]
			return n
		}
		n = b.owned(n)
		n.entries[idx].child = child
		return n
	}
	if e.key != k {
		return n
	}
	*removed = true
	return b.removeSlot(n, idx, bit)
}

func (b *Builder[K, V]) removeSlot(n *node[K, V], idx int, bit uint32) *node[K, V] {
	if len(n.entries) == 1 {
		return nil
	}
	n = b.owned(n)
	copy(n.entries[idx:], n.entries[idx+1:])
	n.entries[len(n.entries)-1] = entry[K, V]{}
	n.entries = n.entries[:len(n.entries)-1]
	n.bitmap &^= bit
	return n
}

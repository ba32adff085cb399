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

// A node keeps its entries and its children apart (the CHAMP layout:
// Steindorfer and Vinju, "Optimizing Hash-Array Mapped Tries for Fast and Lean
// Immutable JVM Collections", 2015): datamap marks the slots that hold an
// entry, nodemap those that hold a child, and each array is in slot order. An
// update copies every node on its path; an upper node holds only children, so
// its copy is 32 pointers, not 32 entries each with room for a child; a lower
// node holds mostly entries, none with room for a child. A node at maxShift
// holds colliding entries, its maps unused.
type node[K comparable, V any] struct {
	datamap  uint32
	nodemap  uint32
	entries  []entry[K, V]
	children []*node[K, V]
	edit     *edit
}

// An entry keeps no hash of its key: a lookup compares the key itself (what a
// hit does anyway), and only a slot two keys share needs the hash again, to
// push them down (a node's copy is what an update pays per level, and every
// entry of every map is memory held).
type entry[K comparable, V any] struct {
	key K
	val V
}

type edit struct{ open bool }

// A node is allocated together with its entries, or, holding none, with its
// children (in size classes, finer for entries: a lower node's copy is what
// an update pays most, and a class's room past the entries is copied too), so
// a lookup touches one allocation per level, not two: at 100k keys that is
// half the cache misses. A node of entries has room for one child beside them
// (near the leaves, a slot two keys share among plain entries); more children
// have an array of their own.
type (
	nodeE1[K comparable, V any] struct {
		n   node[K, V]
		buf [1]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE2[K comparable, V any] struct {
		n   node[K, V]
		buf [2]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE3[K comparable, V any] struct {
		n   node[K, V]
		buf [3]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE4[K comparable, V any] struct {
		n   node[K, V]
		buf [4]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE6[K comparable, V any] struct {
		n   node[K, V]
		buf [6]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE8[K comparable, V any] struct {
		n   node[K, V]
		buf [8]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE12[K comparable, V any] struct {
		n   node[K, V]
		buf [12]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE16[K comparable, V any] struct {
		n   node[K, V]
		buf [16]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE24[K comparable, V any] struct {
		n   node[K, V]
		buf [24]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeE32[K comparable, V any] struct {
		n   node[K, V]
		buf [32]entry[K, V]
		kid [1]*node[K, V]
	}
	nodeC1[K comparable, V any] struct {
		n   node[K, V]
		buf [1]*node[K, V]
	}
	nodeC2[K comparable, V any] struct {
		n   node[K, V]
		buf [2]*node[K, V]
	}
	nodeC4[K comparable, V any] struct {
		n   node[K, V]
		buf [4]*node[K, V]
	}
	nodeC8[K comparable, V any] struct {
		n   node[K, V]
		buf [8]*node[K, V]
	}
	nodeC16[K comparable, V any] struct {
		n   node[K, V]
		buf [16]*node[K, V]
	}
	nodeC32[K comparable, V any] struct {
		n   node[K, V]
		buf [32]*node[K, V]
	}
)

// withEntries returns an empty node with room for at least size entries and
// for one child.
func withEntries[K comparable, V any](size int) *node[K, V] {
	switch {
	case size == 0:
		return &node[K, V]{}
	case size <= 1:
		x := &nodeE1[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 2:
		x := &nodeE2[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 3:
		x := &nodeE3[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 4:
		x := &nodeE4[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 6:
		x := &nodeE6[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 8:
		x := &nodeE8[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 12:
		x := &nodeE12[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 16:
		x := &nodeE16[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 24:
		x := &nodeE24[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	case size <= 32:
		x := &nodeE32[K, V]{}
		x.n.entries, x.n.children = x.buf[:0], x.kid[:0]
		return &x.n
	}
	return &node[K, V]{entries: make([]entry[K, V], 0, size)} // colliding entries
}

// withChildren returns an empty node with room for at least size children.
func withChildren[K comparable, V any](size int) *node[K, V] {
	switch {
	case size <= 1:
		x := &nodeC1[K, V]{}
		x.n.children = x.buf[:0]
		return &x.n
	case size <= 2:
		x := &nodeC2[K, V]{}
		x.n.children = x.buf[:0]
		return &x.n
	case size <= 4:
		x := &nodeC4[K, V]{}
		x.n.children = x.buf[:0]
		return &x.n
	case size <= 8:
		x := &nodeC8[K, V]{}
		x.n.children = x.buf[:0]
		return &x.n
	case size <= 16:
		x := &nodeC16[K, V]{}
		x.n.children = x.buf[:0]
		return &x.n
	}
	x := &nodeC32[K, V]{}
	x.n.children = x.buf[:0]
	return &x.n
}

// newNode returns an empty node owned by e with room for ne entries and nc children.
func newNode[K comparable, V any](e *edit, ne, nc int) *node[K, V] {
	var n *node[K, V]
	switch {
	case nc == 0:
		n = withEntries[K, V](ne)
	case ne == 0:
		n = withChildren[K, V](nc)
	default:
		n = withEntries[K, V](ne)
		if nc > cap(n.children) {
			n.children = make([]*node[K, V], 0, nc)
		}
	}
	n.edit = e
	return n
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
		if n.datamap&bit != 0 {
			if e := &n.entries[slot(n.datamap, bit)]; e.key == k {
				return e.val, true
			}
			break
		}
		if n.nodemap&bit == 0 {
			break
		}
		n = n.children[slot(n.nodemap, bit)]
	}
	var zero V
	return zero, false
}

// slot returns the index in its array of the slot bit of a node whose slots in that array are set in m.
func slot(m, bit uint32) int { return bits.OnesCount32(m & (bit - 1)) }

// Range calls f for every entry, in no particular order, until f returns false.
func (m Map[K, V]) Range(f func(K, V) bool) {
	if m.root != nil {
		m.root.each(f)
	}
}

// each visits the node's slots in order (entries and children interleaved).
func (n *node[K, V]) each(f func(K, V) bool) bool {
	all := n.datamap | n.nodemap
	if all == 0 { // colliding entries, or the empty root
		for i := range n.entries {
			if !f(n.entries[i].key, n.entries[i].val) {
				return false
			}
		}
		return true
	}
	var ei, ci int
	for all != 0 {
		bit := all & -all
		all &^= bit
		if n.datamap&bit != 0 {
			if !f(n.entries[ei].key, n.entries[ei].val) {
				return false
			}
			ei++
			continue
		}
		if !n.children[ci].each(f) {
			return false
		}
		ci++
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

// Range calls f for every entry the map has now, as Map.Range does; f must
// not update the builder.
func (b *Builder[K, V]) Range(f func(K, V) bool) { b.m.Range(f) }

// Map ends the batch and returns the new map. The builder must not be used after.
func (b *Builder[K, V]) Map() Map[K, V] {
	b.edit.open = false
	return b.m
}

// mutable returns n, if the builder owns it and it has room for de more
// entries and dc more children, or else a copy owned by the builder with
// that room. A node shared with other versions is copied once, at its own
// size (what an update of one key pays per level); a node the builder owns
// grows its arrays in doubling classes (what a batch of many keys pays).
func (b *Builder[K, V]) mutable(n *node[K, V], de, dc int) *node[K, V] {
	ne, nc := len(n.entries)+de, len(n.children)+dc
	owned := n.edit == b.edit
	if owned && cap(n.entries) >= ne {
		if cap(n.children) < nc {
			c := make([]*node[K, V], len(n.children), max(nc, 2*cap(n.children)))
			copy(c, n.children)
			n.children = c
		}
		return n
	}
	if owned && nc > 0 {
		nc = max(nc, cap(n.children))
	}
	c := newNode[K, V](b.edit, ne, nc)
	c.datamap, c.nodemap = n.datamap, n.nodemap
	c.entries = append(c.entries, n.entries...)
	c.children = append(c.children, n.children...)
	return c
}

// Set sets k to v.
func (b *Builder[K, V]) Set(k K, v V) {
	h := b.m.hash(k)
	if b.m.root == nil {
		b.m.root = newNode[K, V](b.edit, 1, 0)
	}
	var added bool
	b.m.root = b.set(b.m.root, 0, h, k, v, &added)
	if added {
		b.m.size++
	}
}

func (b *Builder[K, V]) set(n *node[K, V], shift uint, h uint64, k K, v V, added *bool) *node[K, V] {
	if shift >= maxShift {
		for i := range n.entries {
			if n.entries[i].key == k {
				n = b.mutable(n, 0, 0)
				n.entries[i].val = v
				return n
			}
		}
		n = b.mutable(n, 1, 0)
		n.entries = append(n.entries, entry[K, V]{key: k, val: v})
		*added = true
		return n
	}
	bit := uint32(1) << ((h >> shift) & mask)
	switch {
	case n.nodemap&bit != 0:
		i := slot(n.nodemap, bit)
		child := b.set(n.children[i], shift+bitsPerLevel, h, k, v, added)
		if child != n.children[i] {
			n = b.mutable(n, 0, 0)
			n.children[i] = child
		}
		return n
	case n.datamap&bit == 0:
		n = b.mutable(n, 1, 0)
		n.entries = insertAt(n.entries, slot(n.datamap, bit), entry[K, V]{key: k, val: v})
		n.datamap |= bit
		*added = true
		return n
	}
	i := slot(n.datamap, bit)
	if n.entries[i].key == k {
		n = b.mutable(n, 0, 0)
		n.entries[i].val = v
		return n
	}
	// Two keys share this slot: push both one level down.
	e := n.entries[i]
	child := newNode[K, V](b.edit, 2, 0)
	var ignore bool
	child = b.set(child, shift+bitsPerLevel, b.m.hash(e.key), e.key, e.val, &ignore)
	child = b.set(child, shift+bitsPerLevel, h, k, v, added)
	n = b.mutable(n, 0, 1)
	n.entries = removeAt(n.entries, i)
	n.datamap &^= bit
	n.children = insertAt(n.children, slot(n.nodemap, bit), child)
	n.nodemap |= bit
	return n
}

// insertAt inserts x at s[i]; s has room for it.
func insertAt[T any](s []T, i int, x T) []T {
	s = s[:len(s)+1]
	copy(s[i+1:], s[i:])
	s[i] = x
	return s
}

// removeAt removes s[i], clearing the slot it frees (the array may outlive the slice).
func removeAt[T any](s []T, i int) []T {
	copy(s[i:], s[i+1:])
	var zero T
	s[len(s)-1] = zero
	return s[:len(s)-1]
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
		root = newNode[K, V](b.edit, 1, 0)
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
				n = b.mutable(n, 0, 0)
				n.entries = removeAt(n.entries, i)
				return n
			}
		}
		return n
	}
	bit := uint32(1) << ((h >> shift) & mask)
	switch {
	case n.datamap&bit != 0:
		i := slot(n.datamap, bit)
		if n.entries[i].key != k {
			return n
		}
		*removed = true
		if len(n.entries) == 1 && len(n.children) == 0 {
			return nil
		}
		n = b.mutable(n, 0, 0)
		n.entries = removeAt(n.entries, i)
		n.datamap &^= bit
		return n
	case n.nodemap&bit == 0:
		return n
	}
	i := slot(n.nodemap, bit)
	child := b.del(n.children[i], shift+bitsPerLevel, h, k, removed)
	switch {
	case !*removed:
		return n
	case child == nil: // a child holds two entries or more; kept for safety
		if len(n.children) == 1 && len(n.entries) == 0 {
			return nil
		}
		n = b.mutable(n, 0, 0)
		n.children = removeAt(n.children, i)
		n.nodemap &^= bit
		return n
	case len(child.entries) == 1 && len(child.children) == 0:
		// A child left with one entry folds back into this node.
		n = b.mutable(n, 1, 0)
		n.children = removeAt(n.children, i)
		n.nodemap &^= bit
		n.entries = insertAt(n.entries, slot(n.datamap, bit), child.entries[0])
		n.datamap |= bit
		return n
	}
	n = b.mutable(n, 0, 0)
	n.children[i] = child
	return n
}

package observed

import (
	"reflect"
	"sync"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The ends of the flows are interned: each distinct end (per mesh and type)
// is stored once, named by a 32-bit id, and counted by the flows that name
// it; the last flow to go frees it. An id is pinned (counted) before a flow
// names it, under the end's shard lock, and unpinned under the same lock, so
// an id a flow holds always names its end.

const (
	endShardBits = 4
	endShards    = 1 << endShardBits
)

// endKey names an end: its mesh and type, its form, and what it names —
// a workload, address or principal (a), an identity (id), or for the tag
// form the identity of its tags with its reserved tags (a: ip, b:
// principal), verified against the tags themselves.
type endKey struct {
	mt   uint32
	form inventory.EndpointForm
	id   uint64
	a, b string
}

type endShard struct {
	mu    sync.Mutex
	index map[endKey]int32
	slab  []endEntry
	free  int32 // freed entries, through refs (-1: none)
	_     [64]byte
}

type endEntry struct {
	key      endKey
	given    resource.Tags // the tag form's tags
	tags     resource.Tags // as last resolved
	identity uint64
	refs     int32
	bytes    int64 // as Table.bytes counts it
}

// endBytes is what an end holds beyond its slot: its names and its tags
// (given and resolved, counted apart though they are often one map) at
// the size of a map entry each.
func endBytes(k endKey, given, tags resource.Tags) int64 {
	n := int64(len(k.a) + len(k.b))
	for _, t := range [2]resource.Tags{given, tags} {
		if t == nil {
			continue
		}
		n += 48 // the map's header
		for key, v := range t {
			n += int64(len(key)+len(v)) + 40 // two string headers, the bucket's share
		}
	}
	return n
}

// keyOf is e's key; false for tags that hash to no identity (none given).
func keyOf(t *Table, mt uint32, e *End) endKey {
	k := endKey{mt: mt, form: e.Given.Form()}
	switch k.form {
	case inventory.FormWorkload:
		k.a = e.Given.Workload
	case inventory.FormAddress:
		k.a = e.Given.Address
	case inventory.FormPrincipal:
		k.a = e.Given.Principal
	case inventory.FormIdentity:
		k.id = e.Given.Identity
	default:
		if e.Identity == 0 {
			e.Identity = resource.Identity((*t.mts.Load())[mt].mesh, e.Given.Tags)
		}
		k.id, k.a, k.b = e.Identity, e.Given.Tags[resource.IPTag], e.Given.Tags[resource.PrincipalTag]
	}
	return k
}

// shard is the end shard that holds k.
func (k *endKey) shard() int {
	h := uint64(k.mt)*0x9E3779B97F4A7C15 ^ k.id ^ strHash(k.a) ^ strHash(k.b)<<1 ^ uint64(k.form)
	return int(h>>40) & (endShards - 1)
}

// lookup returns the id of k's end (e's), recording e's resolution; with
// pin, counted once more (created when new). False when not held (without
// pin), or when e's tags collide with another end's by their count (never
// stored: such a flow is not observed).
func (t *Table) lookup(k endKey, e *End, pin bool) (uint32, bool) {
	sh := k.shard()
	s := &t.ends[sh]
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[k]; ok {
		x := &s.slab[i]
		// A later sight of one identity (64 bits of SHA-256 of the tags)
		// and reserved tags is taken for the set first seen: comparing the
		// tags on every sight cost a fifth of a batched decision. A set
		// crafted to collide is counted as the first one's flow, which no
		// decision reads (the registry and the memo compare tags).
		if k.form == inventory.FormTags && len(x.given) != len(e.Given.Tags) {
			return 0, false
		}
		// The last resolution, when it can have moved: an end given as tags
		// resolves to those tags (verified just above), and one given by
		// identity to its set's map each time.
		if k.form != inventory.FormTags && e.Tags != nil && !sameMap(x.tags, e.Tags) {
			x.tags, x.identity = e.Tags, e.Identity
			b := endBytes(x.key, x.given, x.tags)
			t.bytes.Add(b - x.bytes)
			x.bytes = b
		}
		if pin {
			x.refs++
		}
		return uint32(i)<<endShardBits | uint32(sh), true
	}
	if !pin {
		return 0, false
	}
	var i int32
	if s.free >= 0 {
		i = s.free
		s.free = s.slab[i].refs
	} else {
		s.slab = append(s.slab, endEntry{})
		i = int32(len(s.slab) - 1)
	}
	x := &s.slab[i]
	*x = endEntry{key: k, tags: e.Tags, identity: e.Identity, refs: 1}
	if k.form == inventory.FormTags {
		x.given = e.Given.Tags
	}
	x.bytes = endBytes(k, x.given, x.tags)
	t.bytes.Add(x.bytes)
	s.index[k] = i
	return uint32(i)<<endShardBits | uint32(sh), true
}

// keyOfID is the key of an end a flow holds.
func (t *Table) keyOfID(id uint32) endKey {
	s := &t.ends[id&(endShards-1)]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slab[id>>endShardBits].key
}

// unpin counts an end once less, freeing it with its last flow.
func (t *Table) unpin(id uint32) {
	s := &t.ends[id&(endShards-1)]
	i := int32(id >> endShardBits)
	s.mu.Lock()
	defer s.mu.Unlock()
	x := &s.slab[i]
	if x.refs--; x.refs > 0 {
		return
	}
	delete(s.index, x.key)
	t.bytes.Add(-x.bytes)
	*x = endEntry{refs: s.free}
	s.free = i
}

// end returns the end of an id a flow holds.
func (t *Table) end(id uint32) End {
	s := &t.ends[id&(endShards-1)]
	s.mu.Lock()
	defer s.mu.Unlock()
	x := &s.slab[id>>endShardBits]
	e := End{Identity: x.identity, Tags: x.tags}
	switch x.key.form {
	case inventory.FormWorkload:
		e.Given.Workload = x.key.a
	case inventory.FormAddress:
		e.Given.Address = x.key.a
	case inventory.FormPrincipal:
		e.Given.Principal = x.key.a
	case inventory.FormIdentity:
		e.Given.Identity = x.key.id
	default:
		e.Given.Tags = x.given
	}
	return e
}

// sameMap reports whether a and b are one map.
func sameMap(a, b resource.Tags) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// strHash is FNV-1a: a shard's choice, not a key.
func strHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

package inventory

// Identities (docs/workloads.md): a tag set known by its numeric identity
// (Identity), interned so the compact decision path goes identity → tag set →
// memoised decision without building a map per flow. An identity resolves when
// it is the own tag set of a valid workload of the mesh (the inventory) or was
// registered through the API (a Registry, which the server keeps per replica).

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/resource"
)

// Errors of identities. Match them with errors.Is.
var (
	// ErrIdentityNotFound: an identity neither a workload's own tag set nor
	// registered (Identify) in its mesh — or registered and since evicted.
	ErrIdentityNotFound = errors.New("identity not found")
	// ErrIdentityCollision: two distinct tag sets of one mesh have one
	// identity. Registering the second is refused, and an identity the
	// inventory and the registry know with different tag sets is never
	// answered.
	ErrIdentityCollision = errors.New("identity collision")
	// ErrRegistryFull: one tag set larger than the registry's byte bound.
	ErrRegistryFull = errors.New("identity registry full")
)

// TagSet is an interned tag set: its tags (never modified), their identity in
// their mesh, and their memo hash. Compare two by pointer only as a fast path:
// equal sets may be interned twice.
type TagSet struct {
	tags resource.Tags
	id   uint64
	hash uint64 // tagsHash(tags): the memo's key part
}

// Tags returns the set's tags; the caller must not modify them.
func (t *TagSet) Tags() resource.Tags { return t.tags }

// Identity returns the set's identity.
func (t *TagSet) Identity() uint64 { return t.id }

// Hash is the tag set's hash (tagsHash), computed once when it is interned.
func (t *TagSet) Hash() uint64 { return t.hash }

func NewTagSet(id uint64, tags resource.Tags) *TagSet {
	return &TagSet{tags: tags, id: id, hash: TagsHash(tags)}
}

// OwnTags returns tags without the reserved keys (tags itself when it has none).
func OwnTags(tags resource.Tags) resource.Tags {
	n := 0
	for k := range tags {
		if resource.IsReservedTag(k) {
			n++
		}
	}
	if n == 0 {
		return tags
	}
	out := make(resource.Tags, len(tags)-n)
	for k, v := range tags {
		if !resource.IsReservedTag(k) {
			out[k] = v
		}
	}
	return out
}

// Registry defaults.
const (
	DefaultRegistryMaxSets  = 1 << 16
	DefaultRegistryMaxBytes = 32 << 20
	// registryEntryBytes is what an entry costs beyond its tags' bytes (the
	// entry, its map slot, its ring slot), and tagPairBytes each pair.
	registryEntryBytes = 160
	tagPairBytes       = 64
)

// Registry holds the tag sets registered through the API (Identify), by mesh
// and identity, so flows may name them by identity. It is bounded in sets and
// in bytes; when a new set does not fit, the least recently used sets leave
// first, approximated by the CLOCK algorithm (second chance): a lookup marks
// its set used (one atomic store, under a read lock), and the eviction hand
// passes over a marked set once, unmarking it. So the identities sidecars keep
// asking about stay, and a flood of one-off registrations evicts itself; a
// client that meets ErrIdentityNotFound for an identity it registered
// registers it again. (Refusing new sets when full would instead lock out every
// new sidecar for good once the registry filled, and the registry is not
// durable anyway: each replica keeps its own, empty at start.)
//
// It is safe for concurrent use. The engine's snapshots do not hold it: the
// caller passes it to LookupIdentity and Snapshot.Identify.
type Registry struct {
	maxSets  int
	maxBytes int64
	// Identity computes identities; tests replace it to make collisions.
	Identity func(mesh string, tags resource.Tags) uint64

	// meshes holds each mesh's sets, an immutable map replaced whole by a
	// writer: a compact batch finds its mesh once (MeshRegistry), then looks
	// up each identity by the integer alone, with no string hashed per flow.
	meshes atomic.Pointer[map[string]*MeshRegistry]
	// mu orders writers: the count, the CLOCK ring, the bytes. A writer
	// takes mu, then replaces a shard's map.
	mu      sync.Mutex
	count   int
	ring    []*registryEntry // CLOCK order; nil: a free slot (listed in free)
	free    []int
	hand    int
	bytes   int64
	evicted uint64
	// gen changes after every change of the registry (a set added, evicted,
	// or given its second chance by the CLOCK hand): the identity-pair memo's
	// entries resolved at one gen are valid while it stays (pairmemo.go).
	gen atomic.Uint64
}

const registryShards = 64 // a power of 2

// MeshRegistry is the part of a Registry that holds one mesh's sets, by
// identity. Its shards hold immutable maps, each replaced whole by a writer
// (copy on write): a compact batch looks up thousands of identities from
// every core, and a read lock's reader count, written by every lookup,
// bounced between the cores (a quarter of a batch's CPU). A lookup is one
// atomic load and a map read keyed by the integer; a write copies one shard
// (at most maxSets/registryShards entries of the mesh).
type MeshRegistry struct {
	mesh   string
	count  int // sets held; Registry.mu
	shards [registryShards]registryShard
}

type registryShard struct {
	sets atomic.Pointer[map[uint64]*registryEntry] // never modified once stored
}

func (mr *MeshRegistry) shard(id uint64) *registryShard {
	return &mr.shards[Mix64(id)&(registryShards-1)]
}

func (sh *registryShard) get(id uint64) (*registryEntry, bool) {
	m := sh.sets.Load()
	if m == nil {
		return nil, false
	}
	e, ok := (*m)[id]
	return e, ok
}

// set stores e under id, or deletes id when e is nil, in a copy of the
// shard's map. Registry.mu is held.
func (sh *registryShard) set(id uint64, e *registryEntry) {
	var old map[uint64]*registryEntry
	if p := sh.sets.Load(); p != nil {
		old = *p
	}
	m := make(map[uint64]*registryEntry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if e == nil {
		delete(m, id)
	} else {
		m[id] = e
	}
	sh.sets.Store(&m)
}

func (mr *MeshRegistry) get(id uint64) (*registryEntry, bool) {
	if mr == nil {
		return nil, false
	}
	return mr.shard(id).get(id)
}

// Lookup returns the tag set registered under id in the mesh (mr may be nil:
// a mesh with none).
func (mr *MeshRegistry) Lookup(id uint64) (*TagSet, bool) {
	e, ok := mr.get(id)
	if !ok {
		return nil, false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return e.set, true
}

type registryEntry struct {
	mr   *MeshRegistry
	set  *TagSet
	size int64
	slot int
	used atomic.Bool
}

// NewRegistry returns an empty registry of at most maxSets tag sets and
// maxBytes bytes (0: the defaults).
func NewRegistry(maxSets int, maxBytes int64) *Registry {
	if maxSets <= 0 {
		maxSets = DefaultRegistryMaxSets
	}
	if maxBytes <= 0 {
		maxBytes = DefaultRegistryMaxBytes
	}
	r := &Registry{maxSets: maxSets, maxBytes: maxBytes, Identity: resource.Identity}
	r.meshes.Store(&map[string]*MeshRegistry{})
	return r
}

// RegistryStats is a registry's state.
type RegistryStats struct {
	Sets    int
	Bytes   int64
	Evicted uint64 // sets evicted since the start
}

// Stats returns the registry's state.
func (r *Registry) Stats() RegistryStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RegistryStats{Sets: r.count, Bytes: r.bytes, Evicted: r.evicted}
}

func SetBytes(tags resource.Tags) int64 {
	n := int64(registryEntryBytes)
	for k, v := range tags {
		n += int64(len(k)+len(v)) + tagPairBytes
	}
	return n
}

// Mesh returns the part of the registry that holds mesh's sets, nil when it
// holds none: resolve it once, then look identities up with its Lookup.
func (r *Registry) Mesh(mesh string) *MeshRegistry {
	if r == nil {
		return nil
	}
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	return (*r.meshes.Load())[mesh]
}

// Lookup returns the tag set registered under id in mesh.
func (r *Registry) Lookup(mesh string, id uint64) (*TagSet, bool) {
	return r.Mesh(mesh).Lookup(id)
}

// Register interns tags (reserved keys dropped; the caller must not modify
// tags afterwards) in mesh and returns the set. Registering a set again
// returns the registered one. ErrIdentityCollision when another tag set holds
// its identity; ErrRegistryFull when the set alone exceeds the byte bound.
func (r *Registry) Register(mesh string, tags resource.Tags) (*TagSet, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	own := OwnTags(tags)
	id := r.Identity(mesh, own)
	if e, ok := r.Mesh(mesh).get(id); ok {
		return r.existing(e, own)
	}
	size := SetBytes(own)
	if size > r.maxBytes {
		return nil, fmt.Errorf("%w: the tag set takes %d bytes, the registry holds %d", ErrRegistryFull, size, r.maxBytes)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.Mesh(mesh).get(id); ok { // registered meanwhile
		return r.existing(e, own)
	}
	r.makeRoom(size)
	mr := r.Mesh(mesh) // after makeRoom, which may have dropped an emptied mesh
	if mr == nil {
		mr = &MeshRegistry{mesh: mesh}
		r.setMesh(mesh, mr)
	}
	e := &registryEntry{mr: mr, set: NewTagSet(id, own), size: size}
	if n := len(r.free); n > 0 {
		e.slot = r.free[n-1]
		r.free = r.free[:n-1]
		r.ring[e.slot] = e
	} else {
		e.slot = len(r.ring)
		r.ring = append(r.ring, e)
	}
	mr.shard(id).set(id, e)
	mr.count++
	r.count++
	r.bytes += size
	r.gen.Add(1) // after the changes (makeRoom's too): scopes made from now on do not trust what was resolved before them
	return e.set, nil
}

// setMesh stores mr as mesh's part, or drops the mesh when mr is nil, in a
// copy of the meshes' map. r.mu is held.
func (r *Registry) setMesh(mesh string, mr *MeshRegistry) {
	old := *r.meshes.Load()
	m := make(map[string]*MeshRegistry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if mr == nil {
		delete(m, mesh)
	} else {
		m[mesh] = mr
	}
	r.meshes.Store(&m)
}

func (r *Registry) existing(e *registryEntry, tags resource.Tags) (*TagSet, error) {
	if !resource.SameTagSet(e.set.tags, tags) {
		return nil, Collision(e.mr.mesh, e.set.id, e.set.tags, tags)
	}
	e.used.Store(true)
	return e.set, nil
}

func Collision(mesh string, id uint64, a, b resource.Tags) error {
	return fmt.Errorf("%w: in mesh %q, tags %v and %v both have identity %d; the second is refused and the identity is not answered",
		ErrIdentityCollision, mesh, a, b, id)
}

// makeRoom evicts sets, CLOCK order, until one more of size bytes fits.
// r.mu is held.
func (r *Registry) makeRoom(size int64) {
	for r.count > 0 && (r.count >= r.maxSets || r.bytes+size > r.maxBytes) {
		if r.hand >= len(r.ring) {
			r.hand = 0
		}
		e := r.ring[r.hand]
		switch {
		case e == nil:
		case e.used.Load():
			e.used.Store(false) // a second chance
		default:
			e.mr.shard(e.set.id).set(e.set.id, nil)
			if e.mr.count--; e.mr.count == 0 {
				r.setMesh(e.mr.mesh, nil) // so meshes long gone hold no memory
			}
			r.count--
			r.bytes -= e.size
			r.ring[r.hand] = nil
			r.free = append(r.free, r.hand)
			r.evicted++
		}
		r.hand++
	}
}

// Generation is the registry's gen (0 for nil: no registry, no change).
func (r *Registry) Generation() uint64 {
	if r == nil {
		return 0
	}
	return r.gen.Load()
}

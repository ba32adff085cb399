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
	// ErrRegistryFull: a tag set larger than a mesh's part of the registry,
	// or a registry full of other meshes' sets.
	ErrRegistryFull = errors.New("identity registry full")
	// ErrRegistrationLimit: a caller registered more new sets than its limit
	// allows (a Quota's error).
	ErrRegistrationLimit = errors.New("identity registration limit")
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
	DefaultRegistryMaxBytes = 64 << 20
	// One mesh's quota: its sets never take more, and a mesh's new set
	// evicts only its own mesh's sets.
	DefaultRegistryMeshMaxSets  = 1 << 14
	DefaultRegistryMeshMaxBytes = 16 << 20
	// registryEntryBytes is what an entry costs beyond its tags (the entry,
	// its TagSet, its map slot, its ring slot: 112 bytes measured); a tag
	// map costs at least tagMapBytes (Go's smallest map group holds 8
	// pairs) or tagPairBytes a pair, whichever is more, and each pair its
	// strings' bytes plus their allocations' rounding (tagStringBytes).
	registryEntryBytes = 128
	tagMapBytes        = 336
	tagPairBytes       = 80
	tagStringBytes     = 16
	// TombstonesPerSet: the registry remembers this many evicted identities
	// per set it holds, so that a flood must evict four registries' worth of
	// sets before an identity may be given to another set.
	TombstonesPerSet = 4
)

// RegistryLimits bound a Registry. Zero values take the defaults; a mesh's
// quota is at most the whole registry's bound.
type RegistryLimits struct {
	MaxSets      int   // sets of every mesh together (DefaultRegistryMaxSets)
	MaxBytes     int64 // their bytes (DefaultRegistryMaxBytes)
	MeshMaxSets  int   // sets of one mesh (DefaultRegistryMeshMaxSets)
	MeshMaxBytes int64 // their bytes (DefaultRegistryMeshMaxBytes)
	// Tombstones bounds the evicted identities remembered (default
	// TombstonesPerSet × MaxSets; about 60 bytes each).
	Tombstones int
}

// Quota admits the registration of new sets, e.g. a per-caller limit: Take
// is called once for each set Register would add — never for one already
// registered — before anything is evicted for it; an error refuses the set
// and is returned as is. Take is called with the registry's lock held: it
// must not block.
type Quota interface{ Take() error }

// Registry holds the tag sets registered through the API (Identify), by mesh
// and identity, so flows may name them by identity. It is bounded in sets and
// in bytes, as a whole and per mesh. When a new set does not fit, the least
// recently used sets of its own mesh leave first — one mesh never evicts
// another's sets; a new set that fits its mesh's quota but not the whole
// registry, with no set of its mesh left to evict, is refused
// (ErrRegistryFull). The order is approximated by the CLOCK algorithm (second
// chance), one clock per mesh: a lookup marks its set used (one atomic store),
// and the eviction hand passes over a marked set once, unmarking it. So the
// identities sidecars keep asking about stay, and a flood of one-off
// registrations evicts itself; a client that meets ErrIdentityNotFound for
// an identity it registered registers it again. (Refusing new sets when full
// would instead lock out every new sidecar for good once the registry filled,
// and the registry is not durable anyway: each replica keeps its own, empty
// at start.)
//
// An identity is never answered for a tag set other than the one it was
// registered for: the registry remembers the identities it evicted, with a
// fingerprint of their sets (a hash under this process's secret seed), and
// refuses to register another set under one (ErrIdentityCollision) for as
// long as it remembers it (RegistryLimits.Tombstones identities, the oldest
// forgotten first). So a client holding an evicted identity gets
// ErrIdentityNotFound until its own set is registered again, never the
// answer of a colliding set registered meanwhile. Beyond what the registry
// remembers — another replica, or after the flood of evictions that makes it
// forget — what stands is the identity itself: tags hold no control
// characters, so two sets share an identity only by a collision of
// SHA-256's first 64 bits, about 2^64 computations to aim at a given set
// (docs/workloads.md, "Identities").
//
// It is safe for concurrent use. The engine's snapshots do not hold it: the
// caller passes it to LookupIdentity and Snapshot.Identify.
type Registry struct {
	limits RegistryLimits
	// Identity computes identities; tests replace it to make collisions.
	Identity func(mesh string, tags resource.Tags) uint64

	// meshes holds each mesh's sets, an immutable map replaced whole by a
	// writer: a compact batch finds its mesh once (MeshRegistry), then looks
	// up each identity by the integer alone, with no string hashed per flow.
	meshes atomic.Pointer[map[string]*MeshRegistry]
	// mu orders writers: the counts, the clocks, the bytes, the tombstones.
	// A writer takes mu, then replaces a shard's map.
	mu      sync.Mutex
	count   int
	bytes   int64
	evicted uint64
	refused uint64 // sets refused: their mesh's quota or the registry full, a Quota, a tombstone
	// tombs remembers evicted identities (tombstones, FIFO in tombRing).
	tombs    map[tombKey]tomb
	tombRing []tombKey
	tombSeqs []uint64 // the seq each ring entry was put with
	tombNext int      // the ring's oldest entry once it is full
	tombSeq  uint64   // numbers tombstones, so a ring entry for a key put again is told apart
	// gen changes after every change of the registry (a set added, evicted,
	// or given its second chance by the CLOCK hand): the identity-pair memo's
	// entries resolved at one gen are valid while it stays (pairmemo.go).
	gen atomic.Uint64
}

type tombKey struct {
	mesh string
	id   uint64
}

type tomb struct {
	hash uint64 // TagsHash of the evicted set
	seq  uint64
}

const registryShards = 64 // a power of 2

// MeshRegistry is the part of a Registry that holds one mesh's sets, by
// identity. Its shards hold immutable maps, each replaced whole by a writer
// (copy on write): a compact batch looks up thousands of identities from
// every core, and a read lock's reader count, written by every lookup,
// bounced between the cores (a quarter of a batch's CPU). A lookup is one
// atomic load and a map read keyed by the integer; a write copies one shard
// (at most the mesh's quota/registryShards entries).
type MeshRegistry struct {
	mesh   string
	shards [registryShards]registryShard
	// The mesh's clock and counts; Registry.mu.
	count int
	bytes int64
	ring  []*registryEntry // CLOCK order; nil: a free slot (listed in free)
	free  []int
	hand  int
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
// maxBytes bytes (0: the defaults), each mesh within the default quota (at
// most the whole).
func NewRegistry(maxSets int, maxBytes int64) *Registry {
	return NewRegistryWith(RegistryLimits{MaxSets: maxSets, MaxBytes: maxBytes})
}

// NewRegistryWith returns an empty registry bounded by l.
func NewRegistryWith(l RegistryLimits) *Registry {
	if l.MaxSets <= 0 {
		l.MaxSets = DefaultRegistryMaxSets
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultRegistryMaxBytes
	}
	if l.MeshMaxSets <= 0 {
		l.MeshMaxSets = DefaultRegistryMeshMaxSets
	}
	if l.MeshMaxBytes <= 0 {
		l.MeshMaxBytes = DefaultRegistryMeshMaxBytes
	}
	if l.Tombstones <= 0 {
		l.Tombstones = TombstonesPerSet * l.MaxSets
	}
	l.MeshMaxSets = min(l.MeshMaxSets, l.MaxSets)
	l.MeshMaxBytes = min(l.MeshMaxBytes, l.MaxBytes)
	r := &Registry{limits: l, Identity: resource.Identity, tombs: map[tombKey]tomb{}}
	r.meshes.Store(&map[string]*MeshRegistry{})
	return r
}

// Limits returns the registry's bounds, defaults filled in.
func (r *Registry) Limits() RegistryLimits { return r.limits }

// RegistryStats is a registry's state.
type RegistryStats struct {
	Sets       int
	Bytes      int64
	Evicted    uint64 // sets evicted since the start
	Refused    uint64 // new sets refused since the start (quotas, collisions with an evicted set)
	Tombstones int    // evicted identities remembered
}

// Stats returns the registry's state.
func (r *Registry) Stats() RegistryStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RegistryStats{Sets: r.count, Bytes: r.bytes, Evicted: r.evicted, Refused: r.refused, Tombstones: len(r.tombs)}
}

// MeshStats returns the sets and bytes mesh holds.
func (r *Registry) MeshStats(mesh string) (sets int, bytes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if mr := r.Mesh(mesh); mr != nil {
		return mr.count, mr.bytes
	}
	return 0, 0
}

func SetBytes(tags resource.Tags) int64 {
	n := int64(registryEntryBytes) + max(tagMapBytes, int64(len(tags))*tagPairBytes)
	for k, v := range tags {
		n += int64(len(k)+len(v)) + tagStringBytes
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
// its identity, or held it and was evicted; ErrRegistryFull when the set does
// not fit its mesh's quota or the registry.
func (r *Registry) Register(mesh string, tags resource.Tags) (*TagSet, error) {
	return r.RegisterWithin(mesh, tags, nil)
}

// RegisterWithin is Register with q (may be nil) admitting each new set.
func (r *Registry) RegisterWithin(mesh string, tags resource.Tags, q Quota) (*TagSet, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	own := OwnTags(tags)
	id := r.Identity(mesh, own)
	if e, ok := r.Mesh(mesh).get(id); ok {
		return r.existing(e, own)
	}
	size := SetBytes(own)
	if limit := r.limits.MeshMaxBytes; size > limit {
		return nil, fmt.Errorf("%w: the tag set takes %d bytes, a mesh's part of the registry holds %d", ErrRegistryFull, size, limit)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	mr := r.Mesh(mesh)
	if e, ok := mr.get(id); ok { // registered meanwhile
		return r.existing(e, own)
	}
	hash := TagsHash(own)
	key := tombKey{mesh, id}
	if t, ok := r.tombs[key]; ok && t.hash != hash {
		r.refused++
		return nil, fmt.Errorf("%w: in mesh %q, identity %d was evicted from the registry with another tag set than %v; "+
			"the identity is not given to another set", ErrIdentityCollision, mesh, id, own)
	}
	if q != nil {
		if err := q.Take(); err != nil {
			r.refused++
			return nil, err
		}
	}
	created := mr == nil
	if created {
		mr = &MeshRegistry{mesh: mesh}
	}
	evicted := r.makeRoom(mr, size)
	if evicted > 0 {
		r.gen.Add(1) // the sets evicted no longer resolve, whatever follows
	}
	if !r.fits(mr, size) {
		r.refused++
		if mr.count == 0 && !created {
			r.setMesh(mesh, nil)
		}
		return nil, fmt.Errorf("%w: the registry holds %d sets of %d and %d bytes of %d, of other meshes than %q",
			ErrRegistryFull, r.count, r.limits.MaxSets, r.bytes, r.limits.MaxBytes, mesh)
	}
	if created {
		r.setMesh(mesh, mr)
	}
	e := &registryEntry{mr: mr, set: &TagSet{tags: own, id: id, hash: hash}, size: size}
	if n := len(mr.free); n > 0 {
		e.slot = mr.free[n-1]
		mr.free = mr.free[:n-1]
		mr.ring[e.slot] = e
	} else {
		e.slot = len(mr.ring)
		mr.ring = append(mr.ring, e)
	}
	mr.shard(id).set(id, e)
	mr.count++
	mr.bytes += size
	r.count++
	r.bytes += size
	delete(r.tombs, key) // its own set again: the ring's entry for it is skipped when it comes up
	r.gen.Add(1)         // after the changes: scopes made from now on do not trust what was resolved before them
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

// fits reports whether one more set of size bytes fits mr's quota and the
// registry. r.mu is held.
func (r *Registry) fits(mr *MeshRegistry, size int64) bool {
	return mr.count < r.limits.MeshMaxSets && mr.bytes+size <= r.limits.MeshMaxBytes &&
		r.count < r.limits.MaxSets && r.bytes+size <= r.limits.MaxBytes
}

// makeRoom evicts sets of mr, CLOCK order, until one more of size bytes fits
// or mr holds none, and returns how many it evicted. r.mu is held.
func (r *Registry) makeRoom(mr *MeshRegistry, size int64) (evicted int) {
	for mr.count > 0 && !r.fits(mr, size) {
		if mr.hand >= len(mr.ring) {
			mr.hand = 0
		}
		e := mr.ring[mr.hand]
		switch {
		case e == nil:
		case e.used.Load():
			e.used.Store(false) // a second chance
			r.gen.Add(1)
		default:
			mr.shard(e.set.id).set(e.set.id, nil)
			mr.count--
			mr.bytes -= e.size
			mr.ring[mr.hand] = nil
			mr.free = append(mr.free, mr.hand)
			r.count--
			r.bytes -= e.size
			r.evicted++
			r.bury(mr.mesh, e.set)
			evicted++
		}
		mr.hand++
	}
	return evicted
}

// bury remembers an evicted set's identity and fingerprint, forgetting the
// oldest remembered once RegistryLimits.Tombstones are.
// r.mu is held.
func (r *Registry) bury(mesh string, set *TagSet) {
	key := tombKey{mesh, set.id}
	r.tombSeq++
	r.tombs[key] = tomb{hash: set.hash, seq: r.tombSeq}
	if len(r.tombRing) < r.limits.Tombstones {
		r.tombRing = append(r.tombRing, key)
		r.tombSeqs = append(r.tombSeqs, r.tombSeq)
		return
	}
	old, oldSeq := r.tombRing[r.tombNext], r.tombSeqs[r.tombNext]
	if t, ok := r.tombs[old]; ok && t.seq == oldSeq {
		delete(r.tombs, old)
	}
	r.tombRing[r.tombNext], r.tombSeqs[r.tombNext] = key, r.tombSeq
	r.tombNext = (r.tombNext + 1) % len(r.tombRing)
}

// Generation is the registry's gen (0 for nil: no registry, no change).
func (r *Registry) Generation() uint64 {
	if r == nil {
		return 0
	}
	return r.gen.Load()
}

package observed

import (
	"context"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// DefaultMax is the flows a table keeps by default.
const DefaultMax = 1_000_000

// DefaultMaxEndBytes bounds the bytes the ends' tags hold by default. Ends
// are what a caller chooses: a flood of distinct ends with kilobytes of tags
// each would otherwise hold gigabytes within the bound on flows.
const DefaultMaxEndBytes = 64 << 20

// FlushInterval is how often Run empties the stripes' caches into the table:
// a flow of the compact path is counted in Flows at most this late, unless a
// read (Flows) empties them first, as every read does.
const FlushInterval = time.Second

// End is one end of a flow: as the request gave it, and the tags (and their
// identity) it was decided on.
type End struct {
	// Given is the endpoint as the request named it; for an end given as
	// tags, Given.Tags holds them.
	Given inventory.Endpoint
	// Identity is the identity of Tags (reserved keys excluded); 0 when not
	// known (computed when the end is first seen).
	Identity uint64
	// Tags are the tags the flow was decided on (shared: never modified).
	Tags resource.Tags
}

// Decision is one decision of a flow, as the recorder hands it.
type Decision struct {
	Mesh, Type          string
	Source, Destination End
	Protocol            resource.Protocol
	Port                uint32
	Action              resource.Action
	Policy              string // the policy that decided the final action ("": none)
	Revision            int64
}

// Flow is one flow of the table.
type Flow struct {
	Mesh, Type          string
	Source, Destination End
	Protocol            resource.Protocol
	Port                uint32
	First, Last         time.Time
	Count               uint64
	// The last answer: its final action, deciding policy and revision.
	Action   resource.Action
	Policy   string
	Revision int64
}

// Config configures a Table. Zero values take the defaults.
type Config struct {
	// Max bounds the flows kept (default DefaultMax); beyond it the least
	// recently seen are evicted.
	Max int
	// MaxEndBytes bounds the bytes of the distinct ends' tags and names
	// (default DefaultMaxEndBytes); beyond it the least recently seen flows
	// are evicted until their ends are freed.
	MaxEndBytes int64
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Table is a replica's observed flows. It is safe for concurrent use.
type Table struct {
	max      int
	maxBytes int64
	now      func() time.Time

	mtMu  sync.Mutex
	mtIDs atomic.Pointer[map[meshType]uint32] // immutable, replaced whole under mtMu
	mts   atomic.Pointer[[]meshType]          // by id; append-only, replaced whole under mtMu

	ends    [endShards]endShard
	flows   []flowShard
	stripes []stripe
	count   atomic.Int64 // flows held
	bytes   atomic.Int64 // the ends' bytes held (endBytes)
	evicted atomic.Int64
}

type meshType struct{ mesh, typ string }

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.Max <= 0 {
		cfg.Max = DefaultMax
	}
	if cfg.MaxEndBytes <= 0 {
		cfg.MaxEndBytes = DefaultMaxEndBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Table{max: cfg.Max, maxBytes: cfg.MaxEndBytes, now: cfg.Now}
	t.mtIDs.Store(&map[meshType]uint32{})
	t.mts.Store(&[]meshType{})
	// Enough shards that two cores rarely meet on one, few enough that each
	// holds thousands of flows (a shard's oldest flow stands for the
	// table's).
	n := 1
	for n < 64 && cfg.Max/(n*2) >= 4096 {
		n *= 2
	}
	t.flows = make([]flowShard, n)
	for i := range t.flows {
		f := &t.flows[i]
		f.index = map[flowKey]int32{}
		f.head, f.tail, f.free = -1, -1, -1
	}
	for i := range t.ends {
		t.ends[i].index = map[endKey]int32{}
		t.ends[i].free = -1
	}
	s := 1
	for s < 2*runtime.GOMAXPROCS(0) && s < 16 {
		s *= 2
	}
	t.stripes = make([]stripe, s)
	return t
}

// Max is the table's bound.
func (t *Table) Max() int { return t.max }

// EndBytes is the bytes the ends' tags and names hold, as MaxEndBytes counts them.
func (t *Table) EndBytes() int64 { return t.bytes.Load() }

// Evicted is how many flows were evicted to keep the bounds.
func (t *Table) Evicted() int64 { return t.evicted.Load() }

// Len is how many flows the table holds (the stripes' caches aside).
func (t *Table) Len() int {
	n := 0
	for i := range t.flows {
		f := &t.flows[i]
		f.mu.Lock()
		n += len(f.index)
		f.mu.Unlock()
	}
	return n
}

// Run empties the stripes' caches every FlushInterval until ctx ends.
func (t *Table) Run(ctx context.Context) {
	tick := time.NewTicker(FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.flush()
		}
	}
}

// Observe counts one decision, seen now.
func (t *Table) Observe(d *Decision) {
	now := t.now().UnixNano()
	t.add(t.meshType(d.Mesh, d.Type), &d.Source, &d.Destination, packPort(d.Protocol, d.Port), 1, now, now, d.Action, d.Policy, d.Revision)
}

// Flows returns the flows of the meshes and types keep accepts (nil: all),
// most recently seen first within each shard.
func (t *Table) Flows(keep func(mesh, typ string) bool) []Flow {
	t.flush()
	mts := *t.mts.Load()
	var out []Flow
	for i := range t.flows {
		f := &t.flows[i]
		f.mu.Lock()
		for j := f.head; j >= 0; {
			e := f.at(j)
			j = e.next
			mt := mts[e.key.mt]
			if keep != nil && !keep(mt.mesh, mt.typ) {
				continue
			}
			proto, port := unpackPort(e.key.pp)
			out = append(out, Flow{Mesh: mt.mesh, Type: mt.typ, Source: t.end(e.key.src), Destination: t.end(e.key.dst),
				Protocol: proto, Port: port, First: time.Unix(0, e.first), Last: time.Unix(0, e.last), Count: e.count,
				Action: e.action, Policy: e.policy, Revision: e.rev})
		}
		f.mu.Unlock()
	}
	return out
}

// meshType returns the id of a mesh and type ("" = the defaults).
func (t *Table) meshType(mesh, typ string) uint32 {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	k := meshType{mesh, typ}
	if id, ok := (*t.mtIDs.Load())[k]; ok {
		return id
	}
	t.mtMu.Lock()
	defer t.mtMu.Unlock()
	old := *t.mtIDs.Load()
	if id, ok := old[k]; ok {
		return id
	}
	list := append(slices.Clone(*t.mts.Load()), k)
	id := uint32(len(list) - 1)
	m := make(map[meshType]uint32, len(old)+1)
	for kk, v := range old {
		m[kk] = v
	}
	m[k] = id
	t.mts.Store(&list) // before the id is published
	t.mtIDs.Store(&m)
	return id
}

func packPort(p resource.Protocol, port uint32) uint32 { return uint32(p)<<16 | port&0xffff }

func unpackPort(pp uint32) (resource.Protocol, uint32) {
	return resource.Protocol(pp >> 16), pp & 0xffff
}

// add counts n decisions of a flow seen from first to last, whose last
// answer is (action, policy, rev).
func (t *Table) add(mt uint32, src, dst *End, pp uint32, n uint64, first, last int64, action resource.Action, policy string, rev int64) {
	// A flow seen before is counted without pinning its ends: found by ids
	// whose gens its entry holds (the ends cannot go while it stays).
	if s, sg, ok := t.find(mt, src); ok {
		if d, dg, ok := t.find(mt, dst); ok {
			k := flowKey{mt: mt, pp: pp, src: s, dst: d}
			if t.flows[k.shard(len(t.flows))].touch(k, [2]uint16{uint16(sg), uint16(dg)}, n, first, last, action, policy, rev) {
				return
			}
		}
	}
	s, sg, ok := t.pin(mt, src)
	if !ok {
		return
	}
	d, dg, ok := t.pin(mt, dst)
	if !ok {
		t.unpin(s)
		return
	}
	k := flowKey{mt: mt, pp: pp, src: s, dst: d}
	sh := k.shard(len(t.flows))
	if !t.flows[sh].add(k, [2]uint16{uint16(sg), uint16(dg)}, n, first, last, action, policy, rev) {
		t.unpin(s)
		t.unpin(d)
		return
	}
	// A new flow: over a bound, the least recently seen flow of its
	// shard goes (of the next shard that holds one, when it was the
	// shard's first), and again while the ends' bytes stay over theirs.
	// Shards fill alike, so their oldest are alike.
	over := t.count.Add(1) > int64(t.max)
	for i := 0; (over || t.bytes.Load() > t.maxBytes) && i < len(t.flows); {
		gone, ok := t.flows[(sh+i)%len(t.flows)].evict()
		if !ok {
			i++ // this shard is empty: the next
			continue
		}
		t.count.Add(-1)
		t.evicted.Add(1)
		t.unpin(gone.src)
		t.unpin(gone.dst)
		over = false
	}
}

// flowKey names a flow: its mesh and type, protocol and port, and its ends.
type flowKey struct {
	mt, pp   uint32
	src, dst uint32 // end ids
}

func (k flowKey) shard(n int) int {
	h := (uint64(k.mt)<<32 | uint64(k.pp)) * 0x9E3779B97F4A7C15
	h ^= (uint64(k.src)<<32 | uint64(k.dst)) * 0xC2B2AE3D27D4EB4F
	return int(bits.RotateLeft64(h, 32) % uint64(n))
}

// flowShard holds some of the flows, in order of last sight (a list through
// the entries, most recent at head).
type flowShard struct {
	mu     sync.Mutex
	index  map[flowKey]int32
	chunks []*[chunk]flowEntry
	used   int32 // entries handed out of the chunks
	free   int32 // entries evicted, through next (-1: none)
	head   int32
	tail   int32
	_      [64]byte // no false sharing between shards' locks
}

// chunk is how many entries a shard allocates at once: its memory grows by
// chunks, never to twice what it holds.
const chunk = 1024

type flowEntry struct {
	key         flowKey
	first, last int64
	count       uint64
	rev         int64
	policy      string
	prev, next  int32
	// gens are its ends' gens as it pinned them (the low 16 bits: an id
	// would be freed 65,536 times between a find and a touch to alias).
	gens   [2]uint16
	action resource.Action
}

func (f *flowShard) at(i int32) *flowEntry { return &f.chunks[i/chunk][i%chunk] }

// touch counts into the flow k when the shard holds it with its ends at
// gens (false: it does not; nothing is counted).
func (f *flowShard) touch(k flowKey, gens [2]uint16, n uint64, first, last int64, action resource.Action, policy string, rev int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.index[k]
	if !ok || f.at(i).gens != gens {
		return false
	}
	f.count(i, n, first, last, action, policy, rev)
	return true
}

// add counts into the flow k, created when new (true) with its ends at gens.
func (f *flowShard) add(k flowKey, gens [2]uint16, n uint64, first, last int64, action resource.Action, policy string, rev int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i, ok := f.index[k]; ok {
		f.count(i, n, first, last, action, policy, rev)
		return false
	}
	var i int32
	if f.free >= 0 {
		i = f.free
		f.free = f.at(i).next
	} else {
		if int(f.used) == len(f.chunks)*chunk {
			f.chunks = append(f.chunks, new([chunk]flowEntry))
		}
		i = f.used
		f.used++
	}
	*f.at(i) = flowEntry{key: k, gens: gens, first: first, last: last, count: n, rev: rev, policy: policy, action: action, prev: -1, next: -1}
	f.index[k] = i
	f.pushHead(i)
	return true
}

// count counts n decisions into entry i. f.mu is held.
func (f *flowShard) count(i int32, n uint64, first, last int64, action resource.Action, policy string, rev int64) {
	e := f.at(i)
	e.count += n
	e.first = min(e.first, first)
	if last >= e.last {
		e.last, e.action, e.policy, e.rev = last, action, policy, rev
	}
	f.toHead(i)
}

// evict removes the least recently seen flow; false when the shard holds
// none.
func (f *flowShard) evict() (flowKey, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.tail
	if i < 0 {
		return flowKey{}, false
	}
	e := f.at(i)
	k := e.key
	delete(f.index, k)
	f.unlink(i)
	*e = flowEntry{next: f.free}
	f.free = i
	return k, true
}

func (f *flowShard) unlink(i int32) {
	e := f.at(i)
	if e.prev >= 0 {
		f.at(e.prev).next = e.next
	} else {
		f.head = e.next
	}
	if e.next >= 0 {
		f.at(e.next).prev = e.prev
	} else {
		f.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (f *flowShard) pushHead(i int32) {
	e := f.at(i)
	e.prev, e.next = -1, f.head
	if f.head >= 0 {
		f.at(f.head).prev = i
	}
	f.head = i
	if f.tail < 0 {
		f.tail = i
	}
}

func (f *flowShard) toHead(i int32) {
	if f.head == i {
		return
	}
	f.unlink(i)
	f.pushHead(i)
}

package observed

import (
	"context"
	"hash/maphash"
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
	At                  int64 // when it was made (Unix ns); 0: now, by the table's clock
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
		f.free, f.head, f.tail = -1, -1, -1
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
		n += f.index.n
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

// Observe counts one decision, seen at d.At.
func (t *Table) Observe(d *Decision) {
	now := d.At
	if now == 0 {
		now = t.now().UnixNano()
	}
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
				Protocol: proto, Port: port, First: time.Unix(0, e.first), Last: time.Unix(0, e.last), Count: e.count(),
				Action: e.action(), Policy: e.policy, Revision: e.rev})
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
	sk, dk := keyOf(t, mt, src), keyOf(t, mt, dst)
	fp := fingerprint(mt, pp, &sk, &dk)
	// An end named by workload, address or principal records its last
	// resolution (an address can change hands); one named by its tags or
	// by identity resolves to the same tags for the identity's life.
	if resolves(sk.form) {
		t.lookup(sk, src, false)
	}
	if resolves(dk.form) {
		t.lookup(dk, dst, false)
	}
	sh := fp.shard(len(t.flows))
	// A flow seen before is counted by its fingerprint alone: one probe, no
	// end looked up (its entry pins its ends).
	if t.flows[sh].touch(fp, n, first, last, action, policy, rev) {
		return
	}
	s, ok := t.lookup(sk, src, true)
	if !ok {
		return
	}
	d, ok := t.lookup(dk, dst, true)
	if !ok {
		t.unpin(s)
		return
	}
	k := flowKey{mt: mt, pp: pp, src: s, dst: d}
	if !t.flows[sh].add(fp, k, n, first, last, action, policy, rev) {
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
		gone, ok := t.flows[(sh+i)%len(t.flows)].evict(t)
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

// resolves reports whether an end of form names what may resolve to other
// tags over time.
func resolves(form inventory.EndpointForm) bool {
	return form != inventory.FormTags && form != inventory.FormIdentity
}

// flowKey is what a flow's entry holds of it: its mesh and type, protocol
// and port, and its ends.
type flowKey struct {
	mt, pp   uint32
	src, dst uint32 // end ids
}

// flowFP names a flow in its shard's index: 64 bits of a hash, under a
// seed secret to the process, of its mesh and type, protocol and port, and
// its ends' keys. Two flows share one with a chance of 2^-64 a pair (about
// 10^-11 for a shard of 16k flows), and a caller cannot aim at one without
// the seed; such a pair would be counted as one flow, which no decision
// reads (as the ends' identities are taken for their tags, ends.go).
type flowFP uint64

var fpSeed = maphash.MakeSeed()

type fpInput struct {
	mt, pp   uint32
	src, dst endKey
}

func fingerprint(mt, pp uint32, src, dst *endKey) flowFP {
	return flowFP(maphash.Comparable(fpSeed, fpInput{mt: mt, pp: pp, src: *src, dst: *dst}))
}

func (fp flowFP) shard(n int) int { return int((uint64(fp) >> 40) % uint64(n)) }

// flowShard holds some of the flows, in order of last sight: a list through
// the entries, most recent at head, whose tail is evicted first.
type flowShard struct {
	mu     sync.Mutex
	index  flowIndex
	chunks []*[chunk]flowEntry
	used   int32    // entries handed out of the chunks
	free   int32    // entries evicted, through next (-1: none)
	head   int32    // most recently seen (-1: none)
	tail   int32    // least recently seen (-1: none)
	_      [64]byte // no false sharing between shards' locks
}

// chunk is how many entries a shard allocates at once: its memory grows by
// chunks, never to twice what it holds.
const chunk = 1024

type flowEntry struct {
	key         flowKey
	first, last int64
	// meta is the count (high 56 bits) and the last answer's action (low
	// 8 bits); 0: free.
	meta       uint64
	rev        int64
	policy     string
	prev, next int32 // the list (next: the free list's, when free)
}

const metaCount = 1 << 8

func (e *flowEntry) count() uint64           { return e.meta >> 8 }
func (e *flowEntry) action() resource.Action { return resource.Action(e.meta & 0xff) }

func (f *flowShard) at(i int32) *flowEntry { return &f.chunks[i/chunk][i%chunk] }

// touch counts into the flow fp when the shard holds it (false: it does
// not; nothing is counted).
func (f *flowShard) touch(fp flowFP, n uint64, first, last int64, action resource.Action, policy string, rev int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.index.get(fp)
	if !ok {
		return false
	}
	f.count(i, n, first, last, action, policy, rev)
	return true
}

// add counts into the flow fp, created with key k when new (true).
func (f *flowShard) add(fp flowFP, k flowKey, n uint64, first, last int64, action resource.Action, policy string, rev int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i, ok := f.index.get(fp); ok {
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
	*f.at(i) = flowEntry{key: k, first: first, last: last, meta: n*metaCount | uint64(action), rev: rev, policy: policy, prev: -1, next: -1}
	f.index.put(fp, i)
	f.pushHead(i)
	return true
}

// count counts n decisions into entry i, now the most recently seen. f.mu
// is held.
func (f *flowShard) count(i int32, n uint64, first, last int64, action resource.Action, policy string, rev int64) {
	e := f.at(i)
	meta := e.meta + n*metaCount
	e.first = min(e.first, first)
	if last >= e.last {
		e.last, e.policy, e.rev = last, policy, rev
		meta = meta&^0xff | uint64(action)
	}
	e.meta = meta
	f.toHead(i)
}

// evict removes the least recently seen flow; false when the shard holds
// none. Its fingerprint is its ends' keys' (read under their shards' locks,
// taken inside this one's: no path takes them the other way).
func (f *flowShard) evict(t *Table) (flowKey, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.tail
	if i < 0 {
		return flowKey{}, false
	}
	e := f.at(i)
	k := e.key
	sk, dk := t.keyOfID(k.src), t.keyOfID(k.dst)
	f.index.remove(fingerprint(k.mt, k.pp, &sk, &dk))
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

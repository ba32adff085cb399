package analysis

// Bulk evaluation (docs/analysis.md): many flows of one mesh and type decided
// against one snapshot, the work they share done once. Reach, Matrix and
// Impact stand on it.
//
// Two reductions, both exact:
//
//   - Tag classes (classes.go). A decision reads a workload's tags only
//     through the conditions of the selectors of the mesh's scopes and of the
//     type's policies: which keys are present, which values are named (match,
//     In, NotIn), which prefixes and CIDRs a value falls under. Two tag sets
//     that agree on every such condition are decided alike. Intern projects a
//     tag set onto the keys some selector mentions and codes each value: a
//     named value by itself, any other by the prefixes and CIDRs it falls
//     under (one code for all when the key has none): a class, decided on
//     the first tag set interned into it.
//     Replicas of one deployment, instances that differ only by a name no
//     policy names, fall into one class and are decided once per pair and
//     port.
//   - Pair dimensions (bulkbits.go). The partition's rules are put in order,
//     once; per class and end, the rules whose selector on that end the class
//     satisfies are one bitmap over that order, found through postings of the
//     selectors' terms (not by testing every rule); per protocol and port,
//     the rules whose ports match are another. A flow's matching rules are
//     the AND of three bitmaps, and a side's answer is the first set bit, in
//     order, whose rule is a candidate on the side — the scan's own
//     definition — so the answer is the one Decide gives. Everything else
//     (scopes, catch-alls, fallbacks, audit, PerDestination) is the decision
//     procedure itself, run on the class's tags.

import (
	"encoding/binary"
	"slices"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Bulk decides flows of one mesh and type against one snapshot. It is not
// safe for concurrent use; its answers are shared (do not modify them).
type Bulk struct {
	p         *engine.Partition
	mesh, typ string
	closed    bool      // an invalid stored resource closes the partition
	base      *bulkBase // the partition's shared start (nil: closed)
	// interning (classes.go, bulkbase.go): the keys some selector tests,
	// sorted, and their conditions; per key, the signatures of the values
	// met (memo); the classes beside the base's
	keys      []string
	keyConds  []*keyConds
	keyIdx    map[string]int32
	memo      []map[string]string
	keyBuf    []byte
	outConds  map[string]*keyConds // the outside keys' exact conditions
	classes   map[string]int32
	tags      []resource.Tags // per class, the tags it is decided on: the first interned into it
	answers   map[bulkKey]*engine.Decision
	bits      [2]*ruleBits // the enforced and the audit rules in order; built on first need
	bitsOK    bool
	uses      [2][]int32 // per end and class, the decisions the class took
	scan      bulkScan   // the current flow's masks (Decide)
	pair      pairScan   // DecidePorts's state
	decisions int        // decisions made: distinct (class, class, protocol, port)
	// the outside classes (outside.go), computed on first need
	outside      []outsideClass
	outsideNotes []string
}

// ClassID names a tag class of a Bulk.
type ClassID int32

type bulkKey struct {
	src, dst ClassID
	proto    resource.Protocol
	port     uint32
}

// keepAfter is how many decisions a class takes at one end before its mask
// is kept: a class decided once (a peer of Reach) is masked in scratch
// memory.
const keepAfter = 2

// keepAlways, when set, keeps every mask from a class's first decision (the
// tests hold both ways to Decide).
var keepAlways atomic.Bool

// NewBulk returns a bulk evaluator of s's mesh ("" = default) and typ (""
// = TrafficPermission). It fails as Decide does: engine.ErrMeshNotFound for
// a mesh that holds no resource, engine.ErrTypeNotFound for a type the mesh
// does not know.
func NewBulk(s *engine.Snapshot, mesh, typ string) (*Bulk, error) {
	p, err := s.Partition(mesh, typ)
	if err != nil {
		return nil, err
	}
	b := &Bulk{p: p, mesh: p.Mesh(), typ: p.Type(), classes: map[string]int32{},
		answers: map[bulkKey]*engine.Decision{}}
	if p.Closed() {
		b.closed = true
		return b, nil
	}
	b.startFrom(baseOf(p))
	return b, nil
}

// Mesh names the partition's mesh.
func (b *Bulk) Mesh() string { return b.mesh }

// Type names the partition's type.
func (b *Bulk) Type() string { return b.typ }

// Decisions is the number of decisions made so far: one per distinct
// (class, class, protocol, port).
func (b *Bulk) Decisions() int { return b.decisions }

// Intern returns the class of a tag set: equal for every tag set decided
// alike by the reductions above. A new class is decided on the tag set it
// was made from (every tag set of it is decided alike), so tags must not
// be modified after; it allocates only for a new class.
func (b *Bulk) Intern(tags resource.Tags) ClassID {
	// The key of a class: per key of tags some selector tests, in keys'
	// order, the key's index (a uvarint) and the value's code.
	buf := b.keyBuf[:0]
	if len(b.keys) <= 2*len(tags)+8 {
		for i, k := range b.keys {
			if v, ok := tags[k]; ok {
				buf = b.appendCode(buf, i, v)
			}
		}
	} else {
		var ib [16]keyValue
		kvs := ib[:0]
		for k, v := range tags {
			if i, ok := b.keyIdx[k]; ok {
				kvs = append(kvs, keyValue{i, v})
			}
		}
		slices.SortFunc(kvs, func(x, y keyValue) int { return int(x.i - y.i) })
		for _, kv := range kvs {
			buf = b.appendCode(buf, int(kv.i), kv.v)
		}
	}
	b.keyBuf = buf
	if b.base != nil {
		if id, ok := b.base.classes[string(buf)]; ok {
			return ClassID(id)
		}
	}
	if id, ok := b.classes[string(buf)]; ok {
		return ClassID(id)
	}
	id := int32(len(b.tags))
	b.tags = append(b.tags, tags)
	b.classes[string(buf)] = id
	return ClassID(id)
}

// keyValue is a tag of a tag set by its key's index in the Bulk's keys.
type keyValue struct {
	i int32
	v string
}

// appendCode appends the i-th key's index and the code of its value v.
func (b *Bulk) appendCode(buf []byte, i int, v string) []byte {
	if b.memo == nil {
		b.memo = make([]map[string]string, len(b.keys))
	}
	buf = binary.AppendUvarint(buf, uint64(i))
	return b.keyConds[i].appendCode(buf, v, &b.memo[i])
}

// Tags returns the tags a class is decided on (shared: do not modify).
func (b *Bulk) Tags(c ClassID) resource.Tags { return b.tags[c] }

// Decide answers the flow from class src to class dst, deciding it once per
// distinct (src, dst, proto, port). The answer is Decide's for any flow
// between tag sets of those classes (its resolutions aside); it is shared.
func (b *Bulk) Decide(src, dst ClassID, proto resource.Protocol, port uint32) *engine.Decision {
	k := bulkKey{src, dst, proto, port}
	if d, ok := b.answers[k]; ok {
		return d
	}
	d := &engine.Decision{}
	b.decideInto(src, dst, proto, port, d)
	b.answers[k] = d
	return d
}

// decideInto decides the flow from class src to class dst into d, as
// Decide does, for a caller that keeps the answers itself.
func (b *Bulk) decideInto(src, dst ClassID, proto resource.Protocol, port uint32, d *engine.Decision) {
	b.decisions++
	var pre engine.Prefilter
	if !b.closed {
		if scan := b.prepare(src, dst, proto, port); scan != nil {
			pre = scan
		}
	}
	f := index.Flow{Src: b.tags[src], Dst: b.tags[dst], Proto: proto, Port: port}
	b.p.Decide(&f, pre, d)
}

// prepare sets the masks of a flow into b.scan; nil when the partition has
// no rule.
func (b *Bulk) prepare(src, dst ClassID, proto resource.Protocol, port uint32) *bulkScan {
	if !b.buildBits() {
		return nil
	}
	var keep [2]bool
	for end, c := range [2]ClassID{src, dst} {
		u := b.uses[end]
		if int(c) >= len(u) {
			u = append(u, make([]int32, int(c)+1-len(u)+len(u)/2)...)
			b.uses[end] = u
		}
		u[c]++
		keep[end] = u[c] >= keepAfter || keepAlways.Load()
	}
	for i, rb := range b.bits {
		sl := &b.scan.lists[i]
		sl.rb = rb
		if rb == nil {
			continue
		}
		sl.port = rb.portMask(proto, port)
		// A class decided once against a kept end with few rules is
		// tested within that end's rules alone.
		switch {
		case !keep[0] && keep[1]:
			sl.ends[1] = rb.mask(1, dst, b.tags[dst], true)
			if len(sl.ends[1].words) <= withinWords {
				sl.ends[0] = rb.maskWithin(0, b.tags[src], sl.ends[1], sl.port)
				continue
			}
			sl.ends[0] = rb.mask(0, src, b.tags[src], false)
		case !keep[1] && keep[0]:
			sl.ends[0] = rb.mask(0, src, b.tags[src], true)
			if len(sl.ends[0].words) <= withinWords {
				sl.ends[1] = rb.maskWithin(1, b.tags[dst], sl.ends[0], sl.port)
				continue
			}
			sl.ends[1] = rb.mask(1, dst, b.tags[dst], false)
		default:
			sl.ends[0] = rb.mask(0, src, b.tags[src], keep[0])
			sl.ends[1] = rb.mask(1, dst, b.tags[dst], keep[1])
		}
	}
	return &b.scan
}

// buildBits puts the partition's rules in order on first need (ruleBits);
// false when it has none.
func (b *Bulk) buildBits() bool {
	if !b.bitsOK {
		b.bits = [2]*ruleBits{ruleBitsOf(b.p, false), ruleBitsOf(b.p, true)}
		b.bitsOK = true
	}
	return b.bits[0] != nil || b.bits[1] != nil
}

func matcherHolds(m *index.Matcher, tags resource.Tags) bool { return m == nil || m.Matches(tags) }

package analysis

import (
	"math/bits"
	"slices"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ruleOrder is one rule index of a partition in order, for the bulk
// evaluation's pair dimensions (bulk.go): per end, the postings that find
// the rules a tag set satisfies. It is read only, shared by the Bulks of a
// snapshot and carried to the next snapshots while the index stays.
type ruleOrder struct {
	ix    *index.Index
	rules []*index.Rule // in order
	words int
	deny  []uint64 // the DENY rules
	ends  [2]endPostings
}

// ruleBits is a Bulk's state over one rule order: per class and end, and
// per protocol and port, a bitmap over the order.
type ruleBits struct {
	*ruleOrder
	masks   [2]map[ClassID]*mask
	scratch [2]*mask // a mask not kept
	ports   map[portKey][]uint64
	// counting: per rule, the terms of the end's selector a tag set holds
	cnt     []int32
	stamp   []uint32
	gen     uint32
	touched []int32
}

// mask is a bitmap over the order and the words of it that are not zero.
type mask struct {
	bits  []uint64
	words []int32
}

type portKey struct {
	proto resource.Protocol
	port  uint32
}

// endPostings find the rules whose selector on one end a tag set satisfies:
// per exact term and per key whose presence is required, the rules that
// require it; per rule, how many such terms it requires; and the rules that
// require none (only expressions, or nothing), verified whole.
type endPostings struct {
	exact    map[index.TagKV][]int32
	presence map[string][]int32
	need     []int32
	free     []int32
}

// orderKey is a rule order's key among what a snapshot carries.
type orderKey struct {
	mesh, typ string
	audit     bool
}

// ruleBitsOf returns a fresh state over the partition's enforced (audit
// false) or audit rules in order (ruleOrderOf); nil when it has none.
func ruleBitsOf(p *engine.Partition, audit bool) *ruleBits {
	o := ruleOrderOf(p, audit)
	if o == nil {
		return nil
	}
	rb := &ruleBits{ruleOrder: o, ports: map[portKey][]uint64{}}
	n := len(o.rules)
	rb.cnt = make([]int32, n)
	rb.stamp = make([]uint32, n)
	for end := range rb.masks {
		rb.masks[end] = map[ClassID]*mask{}
		rb.scratch[end] = &mask{bits: make([]uint64, o.words)}
	}
	return rb
}

// ruleOrderOf returns the partition's enforced or audit rules in order,
// computed once per snapshot (and kept by the next snapshots of the
// lineage whose partition has the same index); nil when it has none.
func ruleOrderOf(p *engine.Partition, audit bool) *ruleOrder {
	ix := p.Rules(audit)
	if ix == nil || ix.Size == 0 {
		return nil
	}
	return p.Snapshot().Carried(orderKey{p.Mesh(), p.Type(), audit}, func(prev any) any {
		if po, ok := prev.(*ruleOrder); ok && po.ix == ix {
			return po
		}
		return newRuleOrder(ix)
	}).(*ruleOrder)
}

// newRuleOrder puts the rules of ix in order.
func newRuleOrder(ix *index.Index) *ruleOrder {
	rb := &ruleOrder{ix: ix}
	ix.Each(func(r *index.Rule) { rb.rules = append(rb.rules, r) })
	slices.SortFunc(rb.rules, func(x, y *index.Rule) int {
		if x.Key.Less(&y.Key) {
			return -1
		}
		if y.Key.Less(&x.Key) {
			return 1
		}
		return 0
	})
	n := len(rb.rules)
	rb.words = (n + 63) / 64
	rb.deny = make([]uint64, rb.words)
	for end := range rb.ends {
		ep := &rb.ends[end]
		ep.exact = map[index.TagKV][]int32{}
		ep.presence = map[string][]int32{}
		ep.need = make([]int32, n)
	}
	for i, r := range rb.rules {
		if r.Action == resource.Deny {
			rb.deny[i/64] |= 1 << (i % 64)
		}
		for end, m := range [2]*index.Matcher{r.Src, r.Dst} {
			ep := &rb.ends[end]
			if m == nil {
				ep.free = append(ep.free, int32(i))
				continue
			}
			need := int32(len(m.Exact) + len(m.Present))
			for _, kv := range m.Exact {
				ep.exact[kv] = append(ep.exact[kv], int32(i))
			}
			for _, k := range m.Present {
				ep.presence[k] = append(ep.presence[k], int32(i))
			}
			// Expressions that require the key (In with several values, by
			// value; Exists, Prefix and CIDR, by presence) count too; NotIn
			// and DoesNotExist hold without the key and are only verified.
			if m.Sel != nil {
				for _, e := range m.Sel.Expressions {
					switch {
					case e.Operator == resource.OpIn && len(e.Values) == 1:
						// in Exact already
					case e.Operator == resource.OpIn:
						for _, v := range uniq(e.Values) {
							kv := index.TagKV{K: e.Key, V: v}
							ep.exact[kv] = append(ep.exact[kv], int32(i))
						}
						need++
					case e.Operator == resource.OpExists || e.Operator == resource.OpPrefix || e.Operator == resource.OpCIDR:
						ep.presence[e.Key] = append(ep.presence[e.Key], int32(i))
						need++
					}
				}
			}
			ep.need[i] = need
			if ep.need[i] == 0 {
				ep.free = append(ep.free, int32(i))
			}
		}
	}
	return rb
}

// mask returns the rules whose selector on end the class's tags satisfy;
// kept for the class when keep, else in scratch memory valid until the next
// call for the end.
func (rb *ruleBits) mask(end int, c ClassID, tags resource.Tags, keep bool) *mask {
	if m, ok := rb.masks[end][c]; ok {
		return m
	}
	var mk *mask
	if keep {
		mk = &mask{bits: make([]uint64, rb.words)}
		rb.masks[end][c] = mk
	} else {
		mk = rb.scratch[end]
		for _, w := range mk.words {
			mk.bits[w] = 0
		}
		mk.words = mk.words[:0]
	}
	m := mk.bits
	ep := &rb.ends[end]
	rb.gen++
	if rb.gen == 0 {
		clear(rb.stamp)
		rb.gen = 1
	}
	touched := rb.touched[:0]
	bump := func(l []int32) {
		for _, i := range l {
			if rb.stamp[i] != rb.gen {
				rb.stamp[i], rb.cnt[i] = rb.gen, 0
				touched = append(touched, i)
			}
			rb.cnt[i]++
		}
	}
	for k, v := range tags {
		bump(ep.exact[index.TagKV{K: k, V: v}])
		bump(ep.presence[k])
	}
	set := func(i int32) {
		r := rb.rules[i]
		mt := r.Src
		if end == 1 {
			mt = r.Dst
		}
		if matcherHolds(mt, tags) {
			if m[i/64] == 0 {
				mk.words = append(mk.words, i/64)
			}
			m[i/64] |= 1 << (i % 64)
		}
	}
	for _, i := range touched {
		if rb.cnt[i] == ep.need[i] {
			set(i)
		}
	}
	for _, i := range ep.free {
		set(i)
	}
	rb.touched = touched
	slices.Sort(mk.words)
	return mk
}

// maskWithin is mask for a class decided once against an end whose rules
// are few: only the rules of within (the other end's mask) whose ports
// match are tested, as the AND with within would drop the others anyway.
// The result is in scratch memory.
func (rb *ruleBits) maskWithin(end int, tags resource.Tags, within *mask, port []uint64) *mask {
	mk := rb.scratch[end]
	for _, w := range mk.words {
		mk.bits[w] = 0
	}
	mk.words = mk.words[:0]
	for _, w := range within.words {
		x := within.bits[w] & port[w]
		var out uint64
		for x != 0 {
			b := bits.TrailingZeros64(x)
			x &= x - 1
			r := rb.rules[int(w)*64+b]
			mt := r.Src
			if end == 1 {
				mt = r.Dst
			}
			if matcherHolds(mt, tags) {
				out |= 1 << b
			}
		}
		if out != 0 {
			mk.bits[w] = out
			mk.words = append(mk.words, w)
		}
	}
	return mk
}

// withinWords is how many non-zero words a kept mask may have for a class
// decided once against it to be tested within it (maskWithin).
const withinWords = 64

// portMask returns the rules whose ports match a protocol and port.
func (rb *ruleBits) portMask(proto resource.Protocol, port uint32) []uint64 {
	k := portKey{proto, port}
	if m, ok := rb.ports[k]; ok {
		return m
	}
	m := make([]uint64, rb.words)
	for i, r := range rb.rules {
		if index.MatchesPorts(r.Ports, proto, port) {
			m[i/64] |= 1 << (i % 64)
		}
	}
	rb.ports[k] = m
	return m
}

// bulkScan is one flow's masks, per rule index of the partition.
type bulkScan struct {
	lists [2]scanList
}

// scanList is a flow's masks over one rule index: its source's, its
// destination's, its protocol and port's.
type scanList struct {
	rb   *ruleBits
	ends [2]*mask
	port []uint64
}

// Matching hands pick the rules of ix that match the flow by its masks
// (engine.Prefilter): in order, the set bits of the AND of the source's,
// the destination's and the port's masks, of the action class asked. It
// returns false when ix is not one of the partition's indexes (the decision
// scans it).
func (bs *bulkScan) Matching(ix *index.Index, actions int, pick *engine.Pick) bool {
	for i := range bs.lists {
		if l := &bs.lists[i]; l.rb != nil && l.rb.ix == ix {
			l.hand(actions, pick)
			return true
		}
	}
	return false
}

// hand hands pick the matching rules of the list's action class (1: DENY
// rules only, -1: ALLOW only, 0: both) in order, until it wants no more.
func (l *scanList) hand(actions int, pick *engine.Pick) {
	rb := l.rb
	src, dst, port := l.ends[0], l.ends[1], l.port
	words := src.words // the sparser end's words, in order
	if len(dst.words) < len(words) {
		words = dst.words
	}
	for _, w := range words {
		x := src.bits[w] & dst.bits[w] & port[w]
		switch actions {
		case 1:
			x &= rb.deny[w]
		case -1:
			x &^= rb.deny[w]
		}
		for x != 0 {
			r := rb.rules[int(w)*64+bits.TrailingZeros64(x)]
			x &= x - 1
			if !pick.Take(r) {
				return
			}
		}
	}
}

// uniq returns the distinct values of l.
func uniq(l []string) []string {
	out := slices.Clone(l)
	slices.Sort(out)
	return slices.Compact(out)
}

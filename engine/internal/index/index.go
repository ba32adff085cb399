package index

import (
	"cmp"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The rule index (the k-index idea of boolean-expression indexing): every rule is
// filed in exactly one posting list, under one term its selectors require — an
// exact tag (end, key, value), or the presence of a key (end, key) — or in the
// "always" list when its selectors require nothing. A flow probes the lists of
// its own tags and verifies the few rules it finds. Lists are sorted by the rule
// order, so a scan can stop at the first verified match. Lists are immutable
// slices held in persistent maps: an update copies the lists it touches and the
// map nodes on their paths, nothing else.

// Ends of a flow a term can name.
const (
	EndSrc uint8 = 1 << iota
	EndDst
)

type termKey struct {
	end uint8
	key string
}

func termKeyHash(k termKey) uint64 {
	return pmap.StringHash(k.key) ^ uint64(k.end)*0x9E3779B97F4A7C15
}

type term struct {
	end      uint8 // 0: the always list
	presence bool
	key      string
	value    string
}

// List is a posting list: entries sorted by the rule order. An entry carries
// what the scan needs before it touches the rule: an order prefix (ord) and
// the rule's terms as ids (the one the list is filed under left out, since a
// flow that reaches the list has it), so most candidates are rejected without
// following the pointer.
type List []posting

type posting struct {
	ord   uint64 // orderPrefix(&r.key)
	R     *Rule
	ids   [inlineIDs]idTerm
	n     uint8 // ids in use; overflowIDs: every slot in use, and the rule has more terms
	plain bool  // no ports and no expressions: the ids decide the match
}

const (
	inlineIDs   = 4
	overflowIDs = 255
)

// orderPrefix maps an order key to 64 bits so that a.ord < b.ord implies
// a.less(b), and a.less(b) implies a.ord <= b.ord: phase, scope, priority,
// specificity (greater first) and exact entries (greater first), each clamped
// to its bits; from the first field at its bound, the rest is left zero (equal
// prefixes fall back to the whole key). A scan computes it per candidate past
// a best: a key whose fields are all inside their bounds (every key but the
// catch-alls' and extreme ones) takes one expression, not the loop.
func orderPrefix(k *OrderKey) uint64 {
	if k.Phase < prefixPhaseHi && k.Scope > prefixScopeLo && k.Scope < prefixScopeHi &&
		k.Priority > prefixPriorityLo && k.Priority < prefixPriorityHi &&
		k.Total > -prefixRankHi && k.Total < -prefixRankLo && k.Exact > -prefixRankHi && k.Exact < -prefixRankLo {
		return uint64(int64(k.Phase)-prefixPhaseLo)<<62 | uint64(int64(k.Scope)-prefixScopeLo)<<48 |
			uint64(int64(k.Priority)-prefixPriorityLo)<<24 | uint64(-int64(k.Total)-prefixRankLo)<<12 |
			uint64(-int64(k.Exact)-prefixRankLo)
	}
	return orderPrefixClamped(k)
}

// The fields of an order prefix, most significant first: phase 2 bits, scope
// 14, priority 24, total and exact (negated: greater first) 12 each, and
// their bounds. A value at a bound is clamped there and ends the prefix.
const (
	prefixPhaseLo, prefixPhaseHi       = -1, 2
	prefixScopeLo, prefixScopeHi       = -(1 << 13) + 1, 1<<13 - 1
	prefixPriorityLo, prefixPriorityHi = -(1 << 23) + 1, 1<<23 - 1
	prefixRankLo, prefixRankHi         = -(1 << 11) + 1, 1<<11 - 1
)

// orderPrefixClamped is orderPrefix field by field, clamping each.
func orderPrefixClamped(k *OrderKey) uint64 {
	var x uint64
	fields := [...]struct {
		v      int64
		bits   uint
		lo, hi int64
	}{
		{int64(k.Phase), 2, prefixPhaseLo, prefixPhaseHi},
		{int64(k.Scope), 14, prefixScopeLo, prefixScopeHi},
		{int64(k.Priority), 24, prefixPriorityLo, prefixPriorityHi},
		{-int64(k.Total), 12, prefixRankLo, prefixRankHi},
		{-int64(k.Exact), 12, prefixRankLo, prefixRankHi},
	}
	var used uint
	for _, f := range fields {
		v, sat := f.v, false
		if v <= f.lo {
			v, sat = f.lo, true
		} else if v >= f.hi {
			v, sat = f.hi, true
		}
		used += f.bits
		x |= uint64(v-f.lo) << (64 - used)
		if sat {
			break
		}
	}
	return x
}

// before reports whether the entry comes before rule b (ord its prefix) in the order.
func (e *posting) before(b *Rule, ord uint64) bool {
	if e.ord != ord {
		return e.ord < ord
	}
	return e.R.Key.Less(&b.Key)
}

// postings is one term's posting lists, one per action class (ALLOW and DENY):
// DenyOverrides scans the DENY lists alone first, so a decision never walks the
// ALLOW rules ordered above the best DENY. df counts the rules that carry the
// term, filed here or elsewhere; it chooses where new rules are filed, and it
// keeps the term's entry (and its ids) alive while any rule needs it.
//
// Both lists share one slice (in the map of a key's values, an entry's size
// is what an update copies per node and what the map holds per term): the
// ALLOW list is l, the DENY list follows it in l's capacity.
type postings struct {
	l   List
	df  int32
	vid uint32 // the value id of an exact term (valueUnknown for presence)
}

func (p *postings) empty() bool { return cap(p.l) == 0 }

// list returns the posting list of class cl.
func (p *postings) list(cl int) List {
	if cl == classAllow {
		return p.l[:len(p.l):len(p.l)]
	}
	return p.l[len(p.l):cap(p.l)]
}

// reached holds the terms a flow reaches, each as its postings' l (ALLOW
// entries l[:len], DENY l[len:cap]), and their entries per class: a
// decision by the bitmaps needs only the counts (bitsAbove), so the lists
// of each class are laid out (lists) only for a walk. Recording a term is
// one append and two sums, with no branch on whether it has entries of
// each class, which varies from term to term.
type reached struct {
	terms []List
	n     [2]int
}

// add records the term of postings p.
func (rc *reached) add(p *postings) {
	rc.terms = append(rc.terms, p.l)
	rc.n[classAllow] += len(p.l)
	rc.n[classDeny] += cap(p.l) - len(p.l)
}

// lists sets lists to the non-empty lists of the reached terms, per class,
// after the index's always lists.
func (rc *reached) lists(ix *Index, lists *[2][]List) {
	lists[0], lists[1] = lists[0][:0], lists[1][:0]
	for cl := range ix.always {
		if len(ix.always[cl]) > 0 {
			lists[cl] = append(lists[cl], ix.always[cl])
		}
	}
	for _, l := range rc.terms {
		if n := len(l); n > 0 {
			lists[classAllow] = append(lists[classAllow], l[:n:n])
		}
		if d := l[len(l):cap(l)]; len(d) > 0 {
			lists[classDeny] = append(lists[classDeny], d)
		}
	}
}

// Action classes of the posting lists.
const (
	classAllow = 0
	classDeny  = 1
	classAny   = -1 // either class: a merged sequence of bitmaps (bitIndex)
)

func classOf(r *Rule) int {
	if r.Action == resource.Deny {
		return classDeny
	}
	return classAllow
}

type keyPostings struct {
	// A flow's lookup of a key reads kid, presence, few or table and the
	// few's words, in that order and nothing else: they come first, on the
	// struct's first two lines (192 bytes, a size class whose objects
	// start on a line), where they were spread over three.
	kid      uint32 // the key id of this (end, key): ids are per index, never reused
	presence postings
	// few holds exact's entries while they are at most fewMax (nil
	// otherwise): a flow's value of such a key (env, region, zone) is found
	// by comparing a few strings, where exact hashes it and walks nodes.
	// fewWords holds each one's valueWord beside the key, compared first:
	// the values' own bytes are read only for a candidate of 8 bytes or more.
	few []fewValue
	// table, for a key of more values than few lists and at most tableMax
	// (the services of a mesh), holds its values in an open-addressed hash
	// table made by the first lookup (an update makes none; a key's entry is
	// new whenever its values change): a flow's value is found with a probe
	// or two of one array, where exact walks a node per level.
	table    *tableRef
	fewWords [fewMax]uint64
	exact    pmap.Map[string, postings]
	// pend holds changes of the df of exact terms not yet written to exact:
	// a change that moves only a term's df (a rule that carries the term, not
	// filed under it, comes or goes) would copy the map's nodes on the path
	// to it, a few KB in a key of thousands of values. A term whose df falls
	// to 0 stays in exact (its lists empty, its ids kept) while pending, so
	// one that comes back costs nothing either. Past pendMax values, every
	// pending change is written (and dead terms deleted) at once.
	pend []dfDelta
}

// tableRef holds a key's value table once made (keyPostings.table).
type tableRef struct{ p atomic.Pointer[valueTable] }

// tableMax bounds the values of a key that gets a value table.
const tableMax = 1024

// valueTable is a key's exact terms by value, open-addressed with linear
// probing, at most half full; a slot of vid 0 is empty (exact terms have
// ids from firstID).
type valueTable struct {
	slots []valueSlot
	mask  uint64
}

// valueSlot is 64 bytes, a cache line: a table's slots (a power of two, 16
// or more: 1 KiB or more, an allocation aligned to its size class, itself
// a multiple of 64 bytes) start on a line, so a probe reads one line where a
// 56-byte slot mostly straddled two.
type valueSlot struct {
	w uint64 // valueWord(v)
	v string
	p postings
	_ uint64
}

// valueHash spreads a value's word and its last bytes over 64 bits (a value
// of at most 8 bytes is all in its word).
func valueHash(v string, w uint64) uint64 {
	var t uint64
	if n := len(v); n > 8 {
		t = load64(v[n-8:])
	}
	return (w ^ t*0xBF58476D1CE4E5B9) * 0x9E3779B97F4A7C15
}

// get returns value v's postings.
func (t *valueTable) get(v string) (*postings, bool) {
	w := valueWord(v)
	for i := valueHash(v, w) >> 32 & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.p.vid == 0 {
			return nil, false
		}
		if s.w == w && len(s.v) == len(v) && (len(v) < 8 || s.v == v) {
			return &s.p, true
		}
	}
}

// makeTable makes the value table of kp's exact terms.
func (kp *keyPostings) makeTable() *valueTable {
	n := 16
	for n < 2*kp.exact.Len() {
		n *= 2
	}
	t := &valueTable{slots: make([]valueSlot, n), mask: uint64(n - 1)}
	kp.exact.Range(func(v string, p postings) bool {
		w := valueWord(v)
		i := valueHash(v, w) >> 32 & t.mask
		for t.slots[i].p.vid != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = valueSlot{w: w, v: v, p: p}
		return true
	})
	return t
}

// valueTable returns kp's value table, made on first use (nil: the key has
// none): kp never changes, so readers that race to make it make the same.
func (kp *keyPostings) valueTable() *valueTable {
	if kp.table == nil {
		return nil
	}
	if t := kp.table.p.Load(); t != nil {
		return t
	}
	t := kp.makeTable()
	kp.table.p.Store(t)
	return t
}

// valueWord is a value's first bytes (up to 8) with its length in the top
// byte: equal values have equal words, and values under 8 bytes of equal
// words and lengths are equal.
func valueWord(v string) uint64 {
	// Two loads that overlap where the value is shorter than their sum: the
	// bytes both read land on the same bits, so ORing them is the value's
	// bytes in order (a loop of a byte at a time cost a flow's resolution
	// more than the compares it serves).
	var w uint64
	switch n := len(v); {
	case n >= 8:
		w = load64(v)
	case n >= 4:
		w = load32(v) | load32(v[n-4:])<<(8*(n-4))
	case n >= 2:
		w = load16(v) | load16(v[n-2:])<<(8*(n-2))
	case n == 1:
		w = uint64(v[0])
	}
	return w ^ uint64(len(v))<<56
}

// load64, load32 and load16 read a string's first bytes, little-endian (the
// compiler makes each one load).
func load64(v string) uint64 {
	_ = v[7]
	return uint64(v[0]) | uint64(v[1])<<8 | uint64(v[2])<<16 | uint64(v[3])<<24 |
		uint64(v[4])<<32 | uint64(v[5])<<40 | uint64(v[6])<<48 | uint64(v[7])<<56
}

func load32(v string) uint64 {
	_ = v[3]
	return uint64(v[0]) | uint64(v[1])<<8 | uint64(v[2])<<16 | uint64(v[3])<<24
}

func load16(v string) uint64 {
	_ = v[1]
	return uint64(v[0]) | uint64(v[1])<<8
}

// fewValue is one entry of a key of few values (keyPostings.few).
type fewValue struct {
	v string
	p postings
}

// fewMax bounds the values of a key listed in keyPostings.few.
const fewMax = 8

// setExact sets kp's exact terms to m, and few from them.
func (kp *keyPostings) setExact(m pmap.Map[string, postings]) {
	kp.exact, kp.few, kp.table = m, nil, nil
	if n := m.Len(); n > fewMax && n <= tableMax {
		kp.table = &tableRef{}
	}
	if n := m.Len(); n == 0 || n > fewMax {
		return
	}
	kp.few = make([]fewValue, 0, m.Len())
	m.Range(func(v string, p postings) bool {
		kp.fewWords[len(kp.few)] = valueWord(v)
		kp.few = append(kp.few, fewValue{v, p})
		return true
	})
}

// dfDelta is a pending change of the df of the exact term of value v.
type dfDelta struct {
	v string
	d int32
}

// pendMax bounds a key's pending df changes.
const pendMax = 16

// pending returns the pending change of value v's df.
func (kp *keyPostings) pending(v string) int32 {
	for _, x := range kp.pend {
		if x.v == v {
			return x.d
		}
	}
	return 0
}

// addPending adds d to value v's pending change (the slice is kp's own).
func (kp *keyPostings) addPending(v string, d int32) {
	for i := range kp.pend {
		if kp.pend[i].v == v {
			if kp.pend[i].d += d; kp.pend[i].d == 0 {
				kp.pend = slices.Delete(kp.pend, i, i+1)
			}
			return
		}
	}
	kp.pend = append(kp.pend, dfDelta{v, d})
}

// takePending removes value v's pending change and returns it (the slice is kp's own).
func (kp *keyPostings) takePending(v string) int32 {
	for i := range kp.pend {
		if kp.pend[i].v == v {
			d := kp.pend[i].d
			kp.pend = slices.Delete(kp.pend, i, i+1)
			return d
		}
	}
	return 0
}

// Ids. A flow's tags are resolved once per decision to (key id, value id) pairs
// (scratch.vals), so a candidate is verified by comparing integers, not by map
// lookups on strings. Ids come from the index's counter and are bounded by the
// terms its rules carry (a term's entry lives while its df > 0; ids of dead
// terms are not reused until the partition is rebuilt); nothing a request
// brings gets an id.
const (
	valueUnknown uint32 = 1 // the flow has the key with a value no rule names
	firstID      uint32 = 2
)

// idTerm is one exact (val != 0) or presence (val == 0) term of a rule.
type idTerm struct{ kid, vid uint32 }

type Index struct {
	keys pmap.Map[termKey, *keyPostings]
	// listed lists keys by end for a flow's lookups (keyList), made by the
	// first lookup that needs it: an update makes none.
	listed atomic.Pointer[keyList]
	always [2]List
	Size   int
	Ends   uint8
	nextID uint32
	Bits   *bitIndex // the decision procedure of an index of both ends (bitindex.go)
	// merged: the bitmaps hold both action classes in one sequence, for a
	// FirstMatch order (BuildMerged).
	merged bool
}

// keyRef is one key of an end of the index, beside its name.
type keyRef struct {
	key string
	kp  *keyPostings
}

// keyList holds every key of an index, the source's then the destination's,
// each end's by key id (src of the source's), while they are few (listMax;
// refs nil otherwise): a flow's tags are then looked up by the index's keys,
// a map lookup each, rather than walked and each looked up in keys.
type keyList struct {
	refs []keyRef
	src  int
}

// listMax bounds the keys an index lists by end.
const listMax = 64

// keyList returns the index's keys by end, made on first use: the index
// never changes, so readers that race to make it make the same.
func (ix *Index) keyList() *keyList {
	if l := ix.listed.Load(); l != nil {
		return l
	}
	l := ix.makeKeyList()
	ix.listed.Store(l)
	return l
}

// makeKeyList lists the index's keys by end.
func (ix *Index) makeKeyList() *keyList {
	n := ix.keys.Len()
	if n > listMax {
		return &keyList{}
	}
	type endKey struct {
		end uint8
		kr  keyRef
	}
	all := make([]endKey, 0, n)
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		all = append(all, endKey{tk.end, keyRef{tk.key, kp}})
		return true
	})
	slices.SortFunc(all, func(a, b endKey) int {
		return cmp.Or(cmp.Compare(a.end, b.end), cmp.Compare(a.kr.kp.kid, b.kr.kp.kid))
	})
	l := &keyList{refs: make([]keyRef, n)}
	for i, x := range all {
		l.refs[i] = x.kr
		if x.end == EndSrc {
			l.src++
		}
	}
	return l
}

// byEnd returns the keys listed for an end.
func (l *keyList) byEnd(end uint8) []keyRef {
	if end == EndSrc {
		return l.refs[:l.src]
	}
	return l.refs[l.src:]
}

func newIndex(ends uint8) *Index {
	return &Index{keys: pmap.New[termKey, *keyPostings](termKeyHash), Ends: ends, nextID: firstID}
}

// emptyLike returns an empty index of ix's ends and sequences.
func (ix *Index) emptyLike() *Index {
	out := newIndex(ix.Ends)
	out.merged = ix.merged
	return out
}

// terms lists the terms a rule carries and could be filed under: exact terms,
// then presence terms, of the ends the index covers. Presence terms of
// expressions (In with several values, Exists, Prefix, CIDR) come last, after
// the '*' ones.
func (ix *Index) terms(r *Rule, out []term) []term {
	for _, side := range [2]struct {
		end uint8
		m   *Matcher
	}{{EndSrc, r.Src}, {EndDst, r.Dst}} {
		if side.m == nil || ix.Ends&side.end == 0 {
			continue
		}
		for _, kv := range side.m.Exact {
			out = append(out, term{end: side.end, key: kv.K, value: kv.V})
		}
	}
	for _, side := range [2]struct {
		end uint8
		m   *Matcher
	}{{EndSrc, r.Src}, {EndDst, r.Dst}} {
		if side.m == nil || ix.Ends&side.end == 0 {
			continue
		}
		for _, k := range side.m.Present {
			out = append(out, term{end: side.end, key: k, presence: true})
		}
		for i := range side.m.Exprs {
			switch e := &side.m.Exprs[i]; e.Op {
			case resource.OpIn, resource.OpExists, resource.OpPrefix, resource.OpCIDR:
				out = append(out, term{end: side.end, key: e.Key, presence: true})
			}
		}
	}
	return out
}

// termEntry returns a term's postings as the builder holds them, its df
// with its pending change.
func termEntry(t term, kb *pmap.Builder[termKey, *keyPostings]) (postings, bool) {
	kp, ok := kb.Get(termKey{t.end, t.key})
	if !ok {
		return postings{}, false
	}
	if t.presence {
		return kp.presence, true
	}
	p, ok := kp.exact.Get(t.value)
	p.df += kp.pending(t.value)
	return p, ok
}

// chooseTerm picks the term a rule is filed under: an exact term if it has one,
// else a presence term, else the always list; among several, the globally
// rarest — the one the fewest rules carry (df, the pending changes included) —
// so that rules leave the lists of common terms (env, region, zone) that most
// flows probe.
func (ix *Index) chooseTerm(r *Rule, kb *pmap.Builder[termKey, *keyPostings], pending *termChanges) term {
	var buf [8]term
	best, bestDF, bestExact := term{}, int32(-1), false
	for _, t := range ix.terms(r, buf[:0]) {
		exact := !t.presence
		if bestDF >= 0 && bestExact && !exact {
			break // exact terms come first
		}
		var n int32
		if p, ok := termEntry(t, kb); ok {
			n = p.df
		}
		if c := pending.find(t); c != nil {
			n += c.df
		}
		if bestDF < 0 || n < bestDF {
			best, bestDF, bestExact = t, n, exact
		}
	}
	return best
}

// locate finds the term a filed rule is under (rules do not store it: a rule has
// few candidate terms and each list is sorted, so a binary search per term finds it).
func (ix *Index) locate(r *Rule, kb *pmap.Builder[termKey, *keyPostings]) (term, bool) {
	var buf [8]term
	class := classOf(r)
	for _, t := range append(ix.terms(r, buf[:0]), term{}) {
		var l List
		if t.end == 0 {
			l = ix.always[class]
		} else if p, ok := termEntry(t, kb); ok {
			l = p.list(class)
		}
		// Keys are unique within a side; a from and a to item of one policy may
		// share one, so look through the run of equal keys.
		for i := sort.Search(len(l), func(i int) bool { return !l[i].R.Key.Less(&r.Key) }); i < len(l) && !r.Key.Less(&l[i].R.Key); i++ {
			if l[i].R == r {
				return t, true
			}
		}
	}
	return term{}, false
}

// termChange is what an update does to one term: rules unfiled and filed,
// and the change of its df (88 bytes: an update makes one per term of each
// rule it changes).
type termChange struct {
	t      term
	rs     []*Rule // the rules unfiled (rs[:ndel]), then those filed
	ndel   int32
	df     int32
	id     idTerm // the term's ids once its entry exists
	pended bool   // only its df changes, and the change is pending (keyPostings.pend)
}

// changed reports whether the term's entry changes: its df or its lists (a
// rule replaced by one with the same terms changes neither).
func (c *termChange) changed() bool {
	return c.df != 0 || len(c.rs) > 0
}

// lists returns the rules unfiled and filed per class (rs reordered in place).
func (c *termChange) lists() (del, add [2][]*Rule) {
	return byClassIn(c.rs[:c.ndel]), byClassIn(c.rs[c.ndel:])
}

// byClassIn orders rs by class in place and returns each class's run.
func byClassIn(rs []*Rule) (out [2][]*Rule) {
	i := 0
	for j, r := range rs {
		if classOf(r) == classAllow {
			rs[i], rs[j] = rs[j], rs[i]
			i++
		}
	}
	return [2][]*Rule{rs[:i:i], rs[i:len(rs):len(rs)]}
}

// termChanges is an update's changes per term: a slice searched linearly for
// a change of a few rules (the common case: no map to build and hash into),
// a map for a bulk load.
type termChanges struct {
	small []termChange // at most smallTerms; never grows past its capacity
	m     map[term]*termChange
	all   []*termChange // every change, in the order of their first get
	// rules backs the first rule of each change's rs (most hold one): one
	// array for the update, not one per change. A change's slice has no room
	// past its rule, so a second push copies it out.
	rules []*Rule
}

// push adds r to c's rules, unfiled (del) or filed, in rules' array if c has
// none yet and the array has room.
func (cs *termChanges) push(c *termChange, r *Rule, del bool) {
	switch {
	case len(c.rs) == 0 && len(cs.rules) < cap(cs.rules):
		cs.rules = append(cs.rules, r)
		n := len(cs.rules)
		c.rs = cs.rules[n-1 : n : n]
	case del:
		c.rs = slices.Insert(c.rs, int(c.ndel), r)
	default:
		c.rs = append(c.rs, r)
	}
	if del {
		c.ndel++
	}
}

// smallTerms bounds the terms of an update searched linearly.
const smallTerms = 32

// newTermChanges makes room for the changes of at most n terms.
func newTermChanges(n int) *termChanges {
	if n <= smallTerms {
		return &termChanges{small: make([]termChange, 0, n), all: make([]*termChange, 0, n)}
	}
	return &termChanges{m: make(map[term]*termChange, n/2)}
}

// find returns t's change, nil if none.
func (cs *termChanges) find(t term) *termChange {
	if cs.m != nil {
		return cs.m[t]
	}
	for i := range cs.small {
		if cs.small[i].t == t {
			return &cs.small[i]
		}
	}
	return nil
}

// get returns t's change, made if none.
func (cs *termChanges) get(t term) *termChange {
	if c := cs.find(t); c != nil {
		return c
	}
	var c *termChange
	if cs.m != nil {
		c = &termChange{t: t}
		cs.m[t] = c
	} else {
		cs.small = append(cs.small, termChange{t: t}) // within capacity: pointers stay valid
		c = &cs.small[len(cs.small)-1]
	}
	cs.all = append(cs.all, c)
	return c
}

// byKey returns the changes in runs of one (end, key).
func (cs *termChanges) byKey() [][]*termChange {
	if cs.m == nil {
		slices.SortFunc(cs.all, func(a, b *termChange) int {
			if a.t.end != b.t.end {
				return int(a.t.end) - int(b.t.end)
			}
			return strings.Compare(a.t.key, b.t.key)
		})
		var out [][]*termChange
		for i := 0; i < len(cs.all); {
			j := i + 1
			for j < len(cs.all) && cs.all[j].t.end == cs.all[i].t.end && cs.all[j].t.key == cs.all[i].t.key {
				j++
			}
			out = append(out, cs.all[i:j:j])
			i = j
		}
		return out
	}
	at := make(map[termKey]int, len(cs.all)/2)
	var out [][]*termChange
	for _, c := range cs.all {
		tk := termKey{c.t.end, c.t.key}
		i, ok := at[tk]
		if !ok {
			i = len(out)
			at[tk] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], c)
	}
	return out
}

// Update returns an index without the removed rules and with the added ones.
// The receiver is not changed. Removed rules are located by their terms and key.
func (ix *Index) Update(removed, added []*Rule) *Index {
	if len(removed) == 0 && len(added) == 0 {
		return ix
	}
	// An index of both ends gets its bitmaps' index in the same allocation:
	// it is its own, and lives as long.
	var out *Index
	var bits *bitIndex
	if ix.Ends == EndSrc|EndDst {
		both := &struct {
			ix   Index
			bits bitIndex
		}{}
		out, bits = &both.ix, &both.bits
	} else {
		out = &Index{}
	}
	out.Ends, out.Size, out.always, out.nextID, out.merged = ix.Ends, ix.Size, ix.always, ix.nextID, ix.merged
	kb := ix.keys.Builder()
	var buf [8]term
	n := 0
	for _, rs := range [2][]*Rule{removed, added} {
		for _, r := range rs {
			n += len(ix.terms(r, buf[:0]))
		}
	}
	changes := newTermChanges(n)
	changes.rules = make([]*Rule, 0, len(removed)+len(added))
	var always termChange
	get := func(t term) *termChange {
		if t.end == 0 {
			return &always
		}
		return changes.get(t)
	}
	for _, r := range removed {
		t, ok := ix.locate(r, kb)
		if !ok {
			continue // not filed here: nothing to remove
		}
		c := get(t)
		changes.push(c, r, true)
		out.Size--
		for _, t := range ix.terms(r, buf[:0]) {
			get(t).df--
		}
	}
	// Every added rule counts in df before any is filed, so a bulk load files
	// each rule under the term that is rarest over the whole set.
	for _, r := range added {
		for _, t := range ix.terms(r, buf[:0]) {
			get(t).df++
		}
	}
	for _, r := range added {
		t := ix.chooseTerm(r, kb, changes)
		r.file(t.end) // rules are fresh here: filed in this index only
		c := get(t)
		changes.push(c, r, false)
		out.Size++
	}
	// First every term's entry with its df and ids, then the lists (their
	// entries carry the ids of their rules' terms); one builder per map for
	// both, so a node the first pass copies is not copied again. A key none
	// of whose terms changes (a rule replaced by one of the same terms) is
	// only read, for its ids.
	groups := changes.byKey()
	type keyBuild struct {
		kp *keyPostings                   // this update's own copy; nil: the key does not change
		eb pmap.Builder[string, postings] // here, not apart
	}
	builds := make([]keyBuild, len(groups))
	for gi, ts := range groups {
		tk := termKey{ts[0].t.end, ts[0].t.key}
		kp, ok := kb.Get(tk)
		if ok && !slices.ContainsFunc(ts, (*termChange).changed) {
			for _, c := range ts {
				c.id = idTerm{kp.kid, 0}
				if !c.t.presence {
					p, _ := kp.exact.Get(c.t.value) // present: a rule carries it
					c.id.vid = p.vid
				}
			}
			continue
		}
		nkp := &keyPostings{}
		if ok {
			*nkp = *kp
			nkp.pend = slices.Clone(kp.pend)
		} else {
			nkp.exact = pmap.New[string, postings](pmap.StringHash)
			nkp.kid = out.nextID
			nkp.presence.vid = valueUnknown
			out.nextID++
		}
		eb := &builds[gi].eb
		*eb = *nkp.exact.Builder()
		for _, c := range ts {
			if c.t.presence {
				nkp.presence.df += c.df
				c.id = idTerm{nkp.kid, 0}
				continue
			}
			np, ok := eb.Get(c.t.value)
			if ok && !c.changed() {
				c.id = idTerm{nkp.kid, np.vid}
				continue
			}
			if ok && len(c.rs) == 0 {
				nkp.addPending(c.t.value, c.df)
				c.id, c.pended = idTerm{nkp.kid, np.vid}, true
				continue
			}
			if !ok {
				np = postings{vid: out.nextID}
				out.nextID++
			}
			np.df += c.df + nkp.takePending(c.t.value)
			c.id = idTerm{nkp.kid, np.vid}
			eb.Set(c.t.value, np)
		}
		if len(nkp.pend) > pendMax {
			for _, x := range nkp.pend {
				p, _ := eb.Get(x.v)
				if p.df += x.d; p.df <= 0 && p.empty() {
					eb.Delete(x.v)
				} else {
					eb.Set(x.v, p)
				}
			}
			nkp.pend = nil
		}
		builds[gi].kp = nkp
	}
	// Every added rule's term ids, computed once: its posting entry and its
	// bitmap block read them (termIDs).
	ids := out.termIDs(added, changes)
	adel, aadd := always.lists()
	for cl := range out.always {
		if len(adel[cl])+len(aadd[cl]) > 0 {
			out.always[cl] = out.mergeList(nil, out.always[cl], adel[cl], aadd[cl], idTerm{}, ids)
		}
	}
	for gi, ts := range groups {
		kp, eb := builds[gi].kp, &builds[gi].eb
		if kp == nil {
			continue
		}
		tk := termKey{ts[0].t.end, ts[0].t.key}
		for _, c := range ts {
			if c.t.presence {
				out.merge(&kp.presence, c, ids)
				continue
			}
			if !c.changed() || c.pended {
				continue
			}
			p, _ := eb.Get(c.t.value)
			out.merge(&p, c, ids)
			if p.df <= 0 && p.empty() {
				eb.Delete(c.t.value)
			} else {
				eb.Set(c.t.value, p)
			}
		}
		kp.setExact(eb.Map())
		if kp.presence.df <= 0 && kp.presence.empty() && kp.exact.Len() == 0 {
			kb.Delete(tk)
		} else {
			kb.Set(tk, kp)
		}
	}
	out.keys = kb.Map()
	out.Bits = out.updateBits(bits, ix.Bits, removed, added, ids)
	return out
}

// addedIDs holds the term ids of the rules an update adds (termIDs), found
// by a linear search among a few rules, by a map among many.
type addedIDs struct {
	rules []*Rule
	ids   [][]idTerm // beside rules
	at    map[*Rule]int32
	buf   [4][]idTerm // ids' array for a few rules
}

// smallAdds bounds the added rules searched linearly.
const smallAdds = 16

// of returns r's term ids, false if r is not an added rule (nil: none is).
func (a *addedIDs) of(r *Rule) ([]idTerm, bool) {
	if a == nil {
		return nil, false
	}
	if a.at != nil {
		i, ok := a.at[r]
		if !ok {
			return nil, false
		}
		return a.ids[i], true
	}
	if i := slices.Index(a.rules, r); i >= 0 {
		return a.ids[i], true
	}
	return nil, false
}

// termIDs returns the ids of each rule's exact and '*' terms (presence: vid
// 0), the destination's first, exact before '*' on each end; every term has
// its id in changes, since its df changed with the rule. Only indexes of both
// ends use ids (nil otherwise).
func (ix *Index) termIDs(rules []*Rule, changes *termChanges) *addedIDs {
	if ix.Ends != EndSrc|EndDst || len(rules) == 0 {
		return nil
	}
	out := &addedIDs{rules: rules}
	if len(rules) <= len(out.buf) {
		out.ids = out.buf[:len(rules)]
	} else {
		out.ids = make([][]idTerm, len(rules))
	}
	if len(rules) > smallAdds {
		out.at = make(map[*Rule]int32, len(rules))
	}
	n := 0
	for _, r := range rules {
		for _, m := range [2]*Matcher{r.Dst, r.Src} {
			if m != nil {
				n += len(m.Exact) + len(m.Present)
			}
		}
	}
	flat := make([]idTerm, 0, n)
	for i, r := range rules {
		start := len(flat)
		for _, side := range [2]struct {
			end uint8
			m   *Matcher
		}{{EndDst, r.Dst}, {EndSrc, r.Src}} {
			if side.m == nil {
				continue
			}
			for _, kv := range side.m.Exact {
				flat = append(flat, changes.find(term{end: side.end, key: kv.K, value: kv.V}).id)
			}
			for _, k := range side.m.Present {
				flat = append(flat, changes.find(term{end: side.end, key: k, presence: true}).id)
			}
		}
		out.ids[i] = flat[start:len(flat):len(flat)]
		if out.at != nil {
			out.at[r] = int32(i)
		}
	}
	return out
}

// merge applies c's deletions and additions to p's lists: a new slice for
// both, if either changes.
func (ix *Index) merge(p *postings, c *termChange, ids *addedIDs) {
	n := cap(p.l) // a deleted rule is in its list: the lists' new length
	n += len(c.rs) - 2*int(c.ndel)
	if n == cap(p.l) && len(c.rs) == int(c.ndel) {
		return
	}
	out := make(List, 0, n)
	del, add := c.lists()
	out = ix.mergeList(out, p.list(classAllow), del[classAllow], add[classAllow], c.id, ids)
	na := len(out)
	out = ix.mergeList(out, p.list(classDeny), del[classDeny], add[classDeny], c.id, ids)
	if len(out) == 0 {
		p.l = nil
		return
	}
	p.l = out[:na:len(out)]
}

// mergeList appends to dst (nil: a new list) the sorted list l without del,
// with add (as entries whose ids leave out the term t the list is filed
// under).
func (ix *Index) mergeList(dst, l List, del, add []*Rule, skip idTerm, ids *addedIDs) List {
	var gone map[*Rule]struct{} // a few are searched in del
	if len(del) > 8 {
		gone = make(map[*Rule]struct{}, len(del))
		for _, r := range del {
			gone[r] = struct{}{}
		}
	}
	isGone := func(r *Rule) bool {
		if gone != nil {
			_, ok := gone[r]
			return ok
		}
		return slices.Contains(del, r)
	}
	adds := add
	if len(adds) > 1 {
		adds = slices.Clone(add)
		slices.SortFunc(adds, byKeyCmp)
	}
	out := dst
	if out == nil {
		out = make(List, 0, len(l)+len(adds)-len(del))
	}
	i := 0
	for _, e := range l {
		if len(del) > 0 && isGone(e.R) {
			continue
		}
		for i < len(adds) && adds[i].Key.Less(&e.R.Key) {
			rids, _ := ids.of(adds[i])
			out = append(out, entry(adds[i], skip, rids))
			i++
		}
		out = append(out, e)
	}
	for _, r := range adds[i:] {
		rids, _ := ids.of(r)
		out = append(out, entry(r, skip, rids))
	}
	if dst == nil && len(out) == 0 {
		return nil
	}
	return out
}

// byKeyCmp orders rules by their order keys.
func byKeyCmp(a, b *Rule) int {
	switch {
	case a.Key.Less(&b.Key):
		return -1
	case b.Key.Less(&a.Key):
		return 1
	}
	return 0
}

// entry makes a rule's posting in the list whose term has id skip; ids are
// the rule's term ids (termIDs). A rule with more terms than an entry holds is
// marked overflowIDs: its first ones are checked as ids, then the whole rule
// as strings (matchesFlow).
func entry(r *Rule, skip idTerm, ids []idTerm) posting {
	e := posting{ord: orderPrefix(&r.Key), R: r}
	e.plain = r.isPlain()
	n := 0
	for _, id := range ids {
		if id == skip {
			continue
		}
		if n == len(e.ids) {
			e.n, e.plain = overflowIDs, false
			return e
		}
		e.ids[n] = id
		n++
	}
	e.n = uint8(n)
	return e
}

// collect records in rc every term the tags of one end can reach; with
// vals, it also records the ids of the end's tags there.
func (ix *Index) collect(end uint8, tags resource.Tags, rc *reached, vals *flowVals) {
	if ix.keys.Len() == 0 {
		return
	}
	if l := ix.keyList(); l.refs != nil && len(l.byEnd(end)) <= len(tags) {
		for _, kr := range l.byEnd(end) {
			if v, ok := tags[kr.key]; ok {
				kr.kp.reachValue(v, rc, vals)
			}
		}
		return
	}
	for k, v := range tags {
		if kp, ok := ix.keys.GetHashed(termKey{end, k}, termKeyHash(termKey{end, k})); ok {
			kp.reachValue(v, rc, vals)
		}
	}
}

// reachValue records in rc the terms a flow whose end has the key with
// value v reaches; with vals, it records the key's value id there.
func (kp *keyPostings) reachValue(v string, rc *reached, vals *flowVals) {
	vid := valueUnknown
	rc.add(&kp.presence)
	if kp.few != nil {
		// The words are compared into a mask of those equal, without a
		// branch: which of them a flow's value is varies from flow to flow,
		// so a branch per word would be mispredicted about once a key. Words
		// are equal for equal values, and mostly only for them (valueWord).
		w := valueWord(v)
		var eq uint
		for i, x := range kp.fewWords[:len(kp.few)] {
			d := x ^ w
			eq |= uint((d-1)&^d>>63) << i // 1 when d == 0
		}
		for ; eq != 0; eq &= eq - 1 {
			if f := &kp.few[bits.TrailingZeros(eq)]; len(f.v) == len(v) && (len(v) < 8 || f.v == v) {
				vid = f.p.vid
				rc.add(&f.p)
				break
			}
		}
	} else if t := kp.valueTable(); t != nil {
		if p, ok := t.get(v); ok {
			vid = p.vid
			rc.add(p)
		}
	} else if kp.exact.Len() > 0 {
		if p, ok := kp.exact.Get(v); ok {
			vid = p.vid
			rc.add(&p)
		}
	}
	if vals != nil {
		vals.set(kp.kid, vid)
	}
}

// reach records in rc every term a flow can reach (rc.lists lays out their
// lists), and with vals the ids of its tags there.
func (ix *Index) reach(src, dst resource.Tags, rc *reached, vals *flowVals) {
	rc.terms = rc.terms[:0]
	rc.n = [2]int{len(ix.always[classAllow]), len(ix.always[classDeny])}
	if ix.Ends&EndSrc != 0 {
		ix.collect(EndSrc, src, rc, vals)
	}
	if ix.Ends&EndDst != 0 {
		ix.collect(EndDst, dst, rc, vals)
	}
}

// Reach sets sc.Lists to every posting list a flow of ix can reach, per
// action class.
func (sc *Scratch) Reach(ix *Index, src, dst resource.Tags) {
	ix.reach(src, dst, &sc.reached, nil)
	sc.reached.lists(ix, &sc.Lists)
	sc.listed = true
}

// flowVals is a flow's tags as ids, indexed by key id: gen<<32 | value id for
// the tags of the current decision; anything else is absent.
type flowVals struct {
	gen  uint64
	vals []uint64
}

func (fv *flowVals) reset(n uint32) {
	fv.gen++
	if fv.gen >= 1<<31 {
		clear(fv.vals)
		fv.gen = 1
	}
	if uint32(len(fv.vals)) < n {
		fv.vals = make([]uint64, n+n/4)
	}
}

func (fv *flowVals) set(kid, vid uint32) { fv.vals[kid] = fv.gen<<32 | uint64(vid) }

// Each calls f for every rule in the index, list by list.
func (ix *Index) Each(f func(*Rule)) {
	for cl := range ix.always {
		for _, e := range ix.always[cl] {
			f(e.R)
		}
	}
	ix.keys.Range(func(_ termKey, kp *keyPostings) bool {
		for _, e := range kp.presence.l[:cap(kp.presence.l)] {
			f(e.R)
		}
		kp.exact.Range(func(_ string, p postings) bool {
			for _, e := range p.l[:cap(p.l)] {
				f(e.R)
			}
			return true
		})
		return true
	})
}

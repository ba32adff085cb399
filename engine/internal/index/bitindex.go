package index

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sort"
)

// Bit-vector classification (Lakshman & Stiliadis), the decision procedure of
// the rule indexes of both ends (Index.bits). The rules are numbered in
// the rule order and cut into blocks of at most blockMax rules. Per block and
// per dimension — one (end, key) some rule of the block names — three sets:
//
//   - any: the rules that require no exact value of the key ('*', an
//     expression on it, or nothing);
//   - absent: the rules that require neither an exact value nor the key's
//     presence ('*');
//   - exact[value id]: the rules that require that exact value, as sorted
//     positions (sparse: a value is named by few rules of a block).
//
// A flow's candidates in a block are the AND, over the block's dimensions, of
// (any | exact[the flow's value]) where the flow has the key, else absent.
// They match the flow on every exact and '*' term; what is left (ports,
// expressions) is verified on the rule. The words are computed in order, a
// chunk at a time, the most selective dimension first, so a zero chunk skips
// the other dimensions and the scan stops at the first verified rule: the cost
// follows the position of the answer in the order, not the number of rules
// that match. An update rebuilds only the blocks its rules fall in (a block
// past blockMax splits), so it costs at most a few blocks, and readers see
// immutable blocks.

const (
	blockMax  = 4096 // rules of a block at most
	blockFill = 3072 // rules of a block a bulk load or a split leaves, room for inserts
)

// bitIndex is one sequence of blocks per action class (DenyOverrides scans
// the DENY rules alone first), or for a FirstMatch order one sequence of
// both (merged, in classes[0]): the first match of either class decides, so
// one scan finds it, where a scan of the ALLOW blocks and a walk of the DENY
// lists bounded by its answer touch the memory of both.
type bitIndex struct {
	classes [2][]*bitBlock
	merged  bool
}

type bitBlock struct {
	// rules: the slots in order (patching, below), in chunks of slotChunk
	// (a word's), so that a patch copies only the few slots it changes, and
	// the block's copy of the chunks' directory is 8 bytes per chunk.
	rules []*slots
	n     int // slots
	// stale bounds the free slots that may still hold the rule removed from
	// them (a patch leaves it, at most staleMax, rather than copy a chunk of
	// slots to write a neighbour over it).
	stale int
	all   []uint64 // every rule of the block
	// ords: per word, the order prefix of its first slot (slotOrd), so a
	// scan bounded by a rule found before stops without reading a rule.
	ords []uint64
	// resid: rules the bitmaps leave unconstrained on a key whose value no
	// other rule of the block requires (a value of one rule is not worth a
	// directory entry): they are verified whole (rule.matchesFlow).
	resid []uint64
	dims  []bitDim // most selective first
}

type bitDim struct {
	kid    uint32
	dirLo  uint32 // the value id dir starts at
	any    []uint64
	absent []uint64
	// dir maps value id dirLo+i to its place in vids plus one (0: none),
	// when the ids are compact (index): a flow's value is found with one
	// read, where a binary search of vids reads a few lines.
	dir []uint16
	// The rules that require each value: vids sorted, refs beside them,
	// into pos (sorted positions, for a value few rules of the block name)
	// or words (a bitmap, for a value with at least one rule per word on
	// average). A value's bitmap holds any's rules too (any | the value's),
	// so that a flow with the value ANDs one bitmap, not two ORed, and its
	// value's rules are its bits that any lacks. Flat slices: a block holds
	// no map and no slice per value. A flow's setup of a block reads the
	// fields from kid to words (refs and pos only for a value of
	// positions), so they come first, and the struct is padded to three
	// lines (a block's dims start on one: their allocation's size class
	// is a multiple of 64 bytes): the setup reads two lines a dimension.
	words []uint64
	refs  []exactRef
	pos   []uint16
	vids  []uint32
	_     [16]byte
}

// listShare: a value gets a bitmap when its rules in a block are at least a
// listShare-th as many as the block's words; fewer stay sorted positions.
// A scan ANDs a bitmap's chunk as it is, where positions are merged into a
// copy of the chunk first.
const listShare = 8

// listMin: a value of fewer rules in a block stays positions whatever the
// block's words. Every bitmap of a dimension lives in one slice, which a
// patch that shifts slots copies whole: in a sparse block (two to seven
// rules a value) bitmaps would make each such patch copy kilobytes.
const listMin = 8

// exactRef locates one value's rules: pos[off:off+n], or with n == 0 the
// bitmap words[off:off+len(any)], any's rules included.
type exactRef struct{ off, n uint32 }

// slotChunk is the slots of a chunk of b.rules: a word's (b.rules[w] holds
// the rules of word w of the bitmaps).
const slotChunk = 64

// at returns the rule in slot i.
func (b *bitBlock) at(i int) *Rule { return b.rules[i/slotChunk][i%slotChunk] }

// first returns the rule in slot 0: no rule of the block comes before it.
func (b *bitBlock) first() *Rule { return b.rules[0][0] }

// slotOrd is the order prefix of word w's first slot, or past every rule
// when the word holds no slot.
func (b *bitBlock) slotOrd(w int) uint64 {
	if w*slotChunk >= b.n {
		return math.MaxUint64
	}
	return orderPrefix(&b.rules[w][0].Key)
}

// slots is a chunk of a block's slots; those past the block's n are nil.
type slots [slotChunk]*Rule

// chunkSlots cuts slots into chunks of slotChunk (one array for them all).
func chunkSlots(rules []*Rule) []*slots {
	arr := make([]slots, (len(rules)+slotChunk-1)/slotChunk)
	out := make([]*slots, len(arr))
	for c := range arr {
		copy(arr[c][:], rules[c*slotChunk:])
		out[c] = &arr[c]
	}
	return out
}

// gapEvery is the rules a built block lays out per free slot it leaves
// between them, as the words its bitmaps have anyway allow: an insertion then
// finds a free slot within about gapEvery/2 slots of its place, and its shift
// moves that many slots, not every slot up to the block's end (a gapped
// array). A rule moved in the order leaves a free slot where it was, which
// the next move back takes without a shift.
const gapEvery = 32

// gapSlots returns the slot of each of n sorted rules in a block built from
// them, with free slots spread between them (gapEvery), and the block's slots.
// The bitmaps keep the length n rules need (words(n)): the gaps cost a scan
// nothing.
func gapSlots(n int) (slotOf func(i int) int, slots int) {
	gaps := min(n/gapEvery, words(n)*64-n, blockMax-n)
	if gaps <= 0 {
		return func(i int) int { return i }, n
	}
	// Rule i moves up by the gaps before it: one more every n/(gaps+1)
	// rules, all of them by the last rule (gaps < n).
	return func(i int) int { return i + i*(gaps+1)/n }, n + gaps
}

// find returns the place of value vid in d.vids.
func (d *bitDim) find(vid uint32) (int, bool) {
	if d.dir == nil {
		return slices.BinarySearch(d.vids, vid)
	}
	x := vid - d.dirLo
	if x >= uint32(len(d.dir)) || d.dir[x] == 0 {
		return 0, false
	}
	if e := d.dir[x]; e&dirBitmap == 0 {
		return int(e) - 1, true
	}
	return slices.BinarySearch(d.vids, vid) // a bitmap's entry gives no place
}

// dirSpan says when a dimension's values get a direct directory: their ids
// span at most dirSpan times as many. A key of a few values gets one too: a
// binary search of even three values costs a block's setup more than the
// read of a directory.
const dirSpan = 4

// dirBitmap marks a directory entry that gives a value's bitmap, the
// (entry &^ dirBitmap)-th of words, rather than its place in vids plus one:
// a scan finds a flow's value's bitmap with one read, not a read of dir
// then of refs (a block has at most blockMax values, below the bit). A
// patch never moves a bitmap in words (it moves positions only, and a value
// leaves the directory only when its last position does), so the entry
// stays right until the places change, when index runs again.
const dirBitmap = 0x8000

// index sets d.dir from d.vids and d.refs (a new slice: blocks share it
// until then).
func (d *bitDim) index() {
	d.dir, d.dirLo = nil, 0
	n := len(d.vids)
	if n == 0 {
		return
	}
	lo, span := d.vids[0], d.vids[n-1]-d.vids[0]+1
	if span > uint32(dirSpan*n) {
		return
	}
	dir := make([]uint16, span)
	for i, v := range d.vids {
		if r := d.refs[i]; r.n == 0 {
			dir[v-lo] = dirBitmap | uint16(int(r.off)/len(d.any))
		} else {
			dir[v-lo] = uint16(i + 1)
		}
	}
	d.dir, d.dirLo = dir, lo
}

// dirBits returns the bitmap of value vid when the directory names it
// (dirBitmap), else nil: small enough to be inlined in a flow's setup of a
// block, which asks each dimension.
func (d *bitDim) dirBits(vid uint32) []uint64 {
	if x := vid - d.dirLo; x < uint32(len(d.dir)) {
		if e := d.dir[x]; e&dirBitmap != 0 {
			off := int(e&^dirBitmap) * len(d.any)
			return d.words[off : off+len(d.any)]
		}
	}
	return nil
}

// exact returns the rules of the block that require value vid of the key:
// as a bitmap that holds any's rules too, or as sorted positions.
func (d *bitDim) exact(vid uint32) (bits []uint64, list []uint16) {
	var i int
	if d.dir == nil {
		var ok bool
		if i, ok = slices.BinarySearch(d.vids, vid); !ok {
			return nil, nil
		}
	} else {
		x := vid - d.dirLo
		if x >= uint32(len(d.dir)) || d.dir[x] == 0 {
			return nil, nil
		}
		e := d.dir[x]
		if e&dirBitmap != 0 {
			off := int(e&^dirBitmap) * len(d.any)
			return d.words[off : off+len(d.any)], nil
		}
		i = int(e) - 1
	}
	r := d.refs[i]
	if r.n == 0 {
		return d.words[r.off : int(r.off)+len(d.any)], nil
	}
	return nil, d.pos[r.off : r.off+r.n]
}

// words is the bitmap length of n rules: whole chunks of chunkWords words,
// which leave a built block room for free slots (gapSlots).
func words(n int) int { return (n + chunkWords*64 - 1) / (chunkWords * 64) * chunkWords }

// buildBlock makes a block of rules (sorted); ids holds the term ids of the
// rules this update adds (termIDs), the others' are looked up in ix.
func (ix *Index) buildBlock(rules []*Rule, ids *addedIDs) *bitBlock {
	slotOf, n := gapSlots(len(rules))
	nw := words(n)
	// A free slot holds the rule before it, as a bound of the order.
	laid := make([]*Rule, n)
	for i, r := range rules {
		laid[slotOf(i)] = r
	}
	for s := 1; s < n; s++ {
		if laid[s] == nil {
			laid[s] = laid[s-1]
		}
	}
	b := &bitBlock{rules: chunkSlots(laid), n: n, resid: make([]uint64, nw)}
	type dimBuild struct {
		d           *bitDim
		exact, pres []uint64 // rules requiring an exact value, the key's presence
		values      map[uint32][]uint16
	}
	byKid := map[uint32]*dimBuild{}
	dim := func(kid uint32) *dimBuild {
		db := byKid[kid]
		if db == nil {
			db = &dimBuild{d: &bitDim{kid: kid}, exact: make([]uint64, nw), pres: make([]uint64, nw), values: map[uint32][]uint16{}}
			byKid[kid] = db
		}
		return db
	}
	type reqExact struct {
		db  *dimBuild
		vid uint32
	}
	var req []reqExact
	var buf [16]idTerm
	all := make([]uint64, nw)
	for i, r := range rules {
		req = req[:0]
		slot := slotOf(i)
		w, bit := slot/64, uint64(1)<<(slot%64)
		all[w] |= bit
		rids, ok := ids.of(r)
		if !ok {
			rids = ix.lookupIDs(r, buf[:0])
		}
		for _, id := range rids {
			db := dim(id.kid)
			if id.vid == 0 {
				db.pres[w] |= bit
				continue
			}
			db.exact[w] |= bit
			req = append(req, reqExact{db, id.vid})
		}
		// A rule is filed under its value of a key; one that requires two
		// values of a key (a match entry and an In of one other value) can
		// match no flow, and is filed under none.
	exacts:
		for j, q := range req {
			for k, o := range req {
				if o.db == q.db && (o.vid != q.vid || k < j) {
					continue exacts
				}
			}
			q.db.values[q.vid] = append(q.db.values[q.vid], uint16(slot))
		}
	}
	b.all = all
	b.ords = make([]uint64, nw)
	for w := range b.ords {
		b.ords[w] = b.slotOrd(w)
	}
	b.dims = make([]bitDim, 0, len(byKid))
	for _, db := range byKid {
		d := db.d
		d.any, d.absent = make([]uint64, nw), make([]uint64, nw)
		for w := range all {
			d.any[w] = all[w] &^ db.exact[w]
			d.absent[w] = all[w] &^ (db.exact[w] | db.pres[w])
		}
		for vid, l := range db.values {
			if len(l) == 1 { // the rule's own value: verified whole instead
				p := l[0]
				d.any[p/64] |= 1 << (p % 64)
				b.resid[p/64] |= 1 << (p % 64)
				delete(db.values, vid)
			}
		}
		for vid := range db.values {
			d.vids = append(d.vids, vid)
		}
		slices.Sort(d.vids)
		d.refs = make([]exactRef, len(d.vids))
		for i, vid := range d.vids {
			l := db.values[vid]
			if len(l) < max(nw/listShare, listMin) {
				d.refs[i] = exactRef{off: uint32(len(d.pos)), n: uint32(len(l))}
				d.pos = append(d.pos, l...)
				continue
			}
			d.refs[i] = exactRef{off: uint32(len(d.words))}
			ws := slices.Clone(d.any)
			for _, p := range l {
				ws[p/64] |= 1 << (p % 64)
			}
			d.words = append(d.words, ws...)
		}
		d.pos, d.words = slices.Clip(d.pos), slices.Clip(d.words)
		d.index()
		b.dims = append(b.dims, *d)
	}
	// Most selective first: the dimension that leaves the fewest rules
	// unconstrained.
	pop := func(ws []uint64) int {
		c := 0
		for _, w := range ws {
			c += bits.OnesCount64(w)
		}
		return c
	}
	sort.Slice(b.dims, func(i, j int) bool {
		pi, pj := pop(b.dims[i].any), pop(b.dims[j].any)
		if pi != pj {
			return pi < pj
		}
		return b.dims[i].kid < b.dims[j].kid
	})
	return b
}

// lookupIDs appends the ids of a filed rule's exact and '*' terms, looked up
// in ix, as termIDs computes them when the rule is added.
func (ix *Index) lookupIDs(r *Rule, out []idTerm) []idTerm {
	for _, side := range [2]struct {
		end uint8
		m   *Matcher
	}{{EndDst, r.Dst}, {EndSrc, r.Src}} {
		if side.m == nil {
			continue
		}
		for _, kv := range side.m.Exact {
			kp, ok := ix.keys.Get(termKey{side.end, kv.K})
			if !ok {
				continue // every term of an indexed rule has its entry
			}
			vid := valueUnknown // never a flow's value id: the rule matches no flow
			if p, ok := kp.exact.Get(kv.V); ok {
				vid = p.vid
			}
			out = append(out, idTerm{kp.kid, vid})
		}
		for _, k := range side.m.Present {
			if kp, ok := ix.keys.Get(termKey{side.end, k}); ok {
				out = append(out, idTerm{kp.kid, 0})
			}
		}
	}
	return out
}

// updateBits returns the blocks of ix (its keys already updated) without the
// removed rules and with the added ones, in out (its own: nil, a new one);
// old are the blocks before.
func (ix *Index) updateBits(out, old *bitIndex, removed, added []*Rule, ids *addedIDs) *bitIndex {
	if ix.Ends != EndSrc|EndDst {
		return nil
	}
	rm, add := byClass(removed), byClass(added)
	if ix.merged {
		rm, add = [2][]*Rule{removed}, [2][]*Rule{added}
	}
	if out == nil {
		out = &bitIndex{}
	}
	out.merged = ix.merged
	for cl := range out.classes {
		var blocks []*bitBlock
		if old != nil {
			blocks = old.classes[cl]
		}
		out.classes[cl] = ix.updateBlocks(blocks, rm[cl], add[cl], ids)
	}
	return out
}

// byClass splits rules by action class; rules of one class are passed as they are.
func byClass(rules []*Rule) (out [2][]*Rule) {
	if len(rules) == 0 {
		return out
	}
	cl := classOf(rules[0])
	if !slices.ContainsFunc(rules, func(r *Rule) bool { return classOf(r) != cl }) {
		out[cl] = rules
		return out
	}
	for _, r := range rules {
		out[classOf(r)] = append(out[classOf(r)], r)
	}
	return out
}

// updateBlocks returns blocks without the removed rules and with the added
// ones: the blocks they fall in are patched (patchBlock) or, when a block has
// no room, rebuilt; the others are shared.
func (ix *Index) updateBlocks(blocks []*bitBlock, removed, added []*Rule, ids *addedIDs) []*bitBlock {
	if len(removed) == 0 && len(added) == 0 {
		return blocks
	}
	adds := added // read only, unless sorted
	if len(adds) > 1 {
		adds = slices.Clone(added)
		// Stable: rules of equal keys (a from and a to item of one policy,
		// of one class or, in a merged sequence, of two) keep their order,
		// as a build keeps it.
		slices.SortStableFunc(adds, byKeyCmp)
	}
	if len(blocks) == 0 {
		return ix.chunk(adds, ids)
	}
	// The removed rules' slots, by block, and the block each added rule
	// goes in (adds are sorted, so their blocks are too).
	type slot struct{ bi, s int }
	var goneBuf [4]slot
	gone := goneBuf[:0]
	if len(removed) > len(goneBuf) {
		gone = make([]slot, 0, len(removed))
	}
	for _, r := range removed {
		if bi, s, ok := findRule(blocks, r); ok {
			gone = append(gone, slot{bi, s})
		}
	}
	slices.SortFunc(gone, func(a, b slot) int { return cmp.Or(a.bi-b.bi, a.s-b.s) })
	var intoBuf [4]int
	var into []int
	if len(adds) <= len(intoBuf) {
		into = intoBuf[:len(adds)]
	} else {
		into = make([]int, len(adds))
	}
	for i, r := range adds {
		// The last block whose first slot is not after r.
		bi := sort.Search(len(blocks), func(i int) bool { return r.Key.Less(&blocks[i].first().Key) }) - 1
		into[i] = max(bi, 0)
	}
	out := make([]*bitBlock, 0, len(blocks)+1)
	var g []int // one block's slots, sorted
	for bi, b := range blocks {
		g = g[:0]
		for len(gone) > 0 && gone[0].bi == bi {
			g = append(g, gone[0].s)
			gone = gone[1:]
		}
		k := 0
		for k < len(into) && into[k] == bi {
			k++
		}
		a := adds[:k:k]
		adds, into = adds[k:], into[k:]
		if len(g) == 0 && len(a) == 0 {
			out = append(out, b)
			continue
		}
		if nb, ok := patchBlock(b, g, a, ids); ok {
			if nb.live() > 0 {
				out = append(out, nb)
			}
			continue
		}
		merged := make([]*Rule, 0, b.n+len(a))
		i, gi := 0, 0
		for s := 0; s < b.n; s++ {
			if gi < len(g) && g[gi] == s {
				gi++
				continue
			}
			if !b.holds(s) {
				continue
			}
			r := b.at(s)
			for i < len(a) && a[i].Key.Less(&r.Key) {
				merged = append(merged, a[i])
				i++
			}
			merged = append(merged, r)
		}
		merged = append(merged, a[i:]...)
		if len(merged) <= blockMax {
			if len(merged) > 0 {
				out = append(out, ix.buildBlock(merged, ids))
			}
			continue
		}
		out = append(out, ix.chunk(merged, ids)...)
	}
	return out
}

// chunk cuts sorted rules into blocks of about blockFill rules.
func (ix *Index) chunk(rules []*Rule, ids *addedIDs) []*bitBlock {
	if len(rules) == 0 {
		return nil
	}
	k := (len(rules) + blockFill - 1) / blockFill
	var out []*bitBlock
	for i := 0; i < k; i++ {
		out = append(out, ix.buildBlock(rules[len(rules)*i/k:len(rules)*(i+1)/k], ids))
	}
	return out
}

// findRule finds the block and the slot holding r: the blocks whose range of
// keys holds r's key (rules of equal keys may straddle two).
func findRule(blocks []*bitBlock, r *Rule) (int, int, bool) {
	bi := sort.Search(len(blocks), func(i int) bool { return r.Key.Less(&blocks[i].first().Key) }) - 1
	for ; bi >= 0; bi-- {
		b := blocks[bi]
		for i := sort.Search(b.n, func(i int) bool { return !b.at(i).Key.Less(&r.Key) }); i < b.n && !r.Key.Less(&b.at(i).Key); i++ {
			if b.at(i) == r && b.holds(i) {
				return bi, i, true
			}
		}
		if b.first().Key.Less(&r.Key) {
			break // r's key starts inside this block: no earlier block holds it
		}
	}
	return 0, 0, false
}

// dimCursor is one dimension of a block as a flow sees it: the base bitmap
// (absent, any, or the bitmap of the flow's value, which holds any's rules)
// and, for a value of few rules, their sorted positions, read in order.
type dimCursor struct {
	base []uint64
	// next is list[pos], the first position not yet merged, or noPos when
	// none is left: a chunk that ends at or below it ANDs base alone, after
	// one compare.
	next int
	list []uint16
	pos  int
}

// noPos is a cursor's next when it has no position left.
const noPos = math.MaxInt

// chunkWords is the granularity of a block's bitmaps in words (words).
const chunkWords = 8

// scanBits improves best[side], for each side in need, with the first rule in
// order of the class that matches the flow (classAny: of either class, in the
// merged sequence of an index built for FirstMatch); sc.vals holds the flow's ids
// (Index.lists). It computes the candidates a chunk of chunkWords words at a
// time, the block's dimensions most selective first, leaving a chunk at the
// first dimension that empties it, and stops at the first rule verified on
// every side it is open for: the slots are in order, so nothing after it in
// the class comes first.
// A side with a best from before (the other class) bounds the scan by it.
func scanBits(bi *bitIndex, class int, f *Flow, sc *Scratch, need [2]bool, best *[2]*Rule) {
	var ord [2]uint64
	for side := range best {
		if best[side] != nil {
			ord[side] = orderPrefix(&best[side].Key)
		}
	}
	open := need
	// limit bounds the scan while every open side has a best from before:
	// past it no slot improves on any (limit is MaxUint64 otherwise).
	limit := scanLimit(open, best, ord)
	vals := &sc.vals
	blocks := bi.classes[0] // classAny: the merged sequence
	if class != classAny {
		blocks = bi.classes[class]
	}
	for _, b := range blocks {
		if b.ords[0] > limit {
			return
		}
		if cap(sc.cursors) < len(b.dims) {
			sc.cursors = make([]dimCursor, 2*len(b.dims))
		}
		cur := sc.cursors[:len(b.dims)]
		for di := range b.dims {
			d, c := &b.dims[di], &cur[di]
			c.base, c.next, c.list, c.pos = d.absent, noPos, nil, 0
			if x := vals.vals[d.kid]; x>>32 == vals.gen {
				c.base = d.any
				if vid := uint32(x); vid != valueUnknown {
					if ws := d.dirBits(vid); ws != nil {
						c.base = ws
					} else if ws, list := d.exact(vid); ws != nil {
						c.base = ws
					} else if len(list) > 0 {
						c.list, c.next = list, int(list[0])
					}
				}
			}
		}
		all, resid := b.all, b.resid[:len(b.all)]
		ords := b.ords[:len(all)]
		// A chunk of words at a time, each dimension over the whole chunk:
		// a flow's dimensions are weak alone and strong together (a word is
		// seldom emptied before most of them), so branch-free runs over
		// chunkWords words beat leaving each word at its first zero.
		var acc [chunkWords]uint64
		for w0 := 0; w0+chunkWords <= len(all); w0 += chunkWords {
			if ords[w0] > limit {
				return
			}
			if !andChunk(cur, all, w0, &acc) {
				continue // most chunks before the answer: no word to look at
			}
			for k := range acc {
				x := acc[k]
				if x == 0 {
					continue
				}
				w := w0 + k
				if ords[w] > limit {
					return
				}
				rs := b.rules[w] // a word with a bit set holds slots
				for ; x != 0; x &= x - 1 {
					i := bits.TrailingZeros64(x)
					r := rs[i] // a slot: bits past the slots are never set
					// The rule's order prefix, needed only beside a best.
					var e uint64
					known := best[0] != nil || best[1] != nil
					if known {
						if e = orderPrefix(&r.Key); e > limit {
							return
						}
					}
					if resid[w]&(1<<i) != 0 {
						if !r.MatchesFlow(f) {
							continue
						}
					} else if !r.matchesRest(f) {
						continue
					}
					for side := 0; side < 2; side++ {
						if !open[side] || r.Sides&SideBits[side] == 0 || !sc.IsMember(side, r.Scope) {
							continue
						}
						// The first candidate of the side in the class: later
						// slots come after it, so the side closes either way.
						if best[side] == nil || bitBefore(r, e, best[side], ord[side]) {
							if !known {
								e, known = orderPrefix(&r.Key), true
							}
							best[side], ord[side] = r, e
						}
						open[side] = false
					}
					if !open[0] && !open[1] {
						return
					}
					limit = scanLimit(open, best, ord)
				}
			}
		}
	}
}

// andChunk sets acc to the candidates of the chunk of chunkWords words from
// word w0 (all, ANDed with each cursor's rules) and reports whether any is
// left, leaving at the first cursor that empties the chunk (acc is then not
// written). The chunk's words are held in eight variables, not an array, so
// that they stay in registers: an AND reads the cursor's words alone.
func andChunk(cur []dimCursor, all []uint64, w0 int, acc *[chunkWords]uint64) bool {
	s := (*[chunkWords]uint64)(all[w0:])
	a0, a1, a2, a3, a4, a5, a6, a7 := s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
	lo, hi := w0*64, (w0+chunkWords)*64
	for ci := range cur {
		c := &cur[ci]
		b := (*[chunkWords]uint64)(c.base[w0:])
		// A value's positions are few: most chunks hold none of them, and
		// are ANDed with the base alone, not with a copy of it.
		if c.next < hi {
			m := *b
			for c.next < hi {
				// A position below lo is of a chunk left before this
				// cursor: its bit is of no chunk to come.
				if p := c.next; p >= lo {
					m[(p-lo)/64%chunkWords] |= 1 << (p & 63)
				}
				c.pos++
				c.next = noPos
				if c.pos < len(c.list) {
					c.next = int(c.list[c.pos])
				}
			}
			b = &m
		}
		a0 &= b[0]
		a1 &= b[1]
		a2 &= b[2]
		a3 &= b[3]
		a4 &= b[4]
		a5 &= b[5]
		a6 &= b[6]
		a7 &= b[7]
		if a0|a1|a2|a3|a4|a5|a6|a7 == 0 {
			return false
		}
	}
	*acc = [chunkWords]uint64{a0, a1, a2, a3, a4, a5, a6, a7}
	return a0|a1|a2|a3|a4|a5|a6|a7 != 0
}

// scanLimit is the order prefix past which no slot improves on the best of
// any open side, MaxUint64 while an open side has none.
func scanLimit(open [2]bool, best *[2]*Rule, ord [2]uint64) uint64 {
	limit := uint64(0)
	for side := range open {
		if !open[side] {
			continue
		}
		if best[side] == nil {
			return math.MaxUint64
		}
		limit = max(limit, ord[side])
	}
	return limit
}

// bitBefore reports whether rule a (ord its prefix) comes before rule b.
func bitBefore(a *Rule, ord uint64, b *Rule, bord uint64) bool {
	if ord != bord {
		return ord < bord
	}
	return a.Key.Less(&b.Key)
}

// Patching. A block's rules are slots: slot i holds a rule of the block when
// bit i of all is set, else it is free — a free slot holds a rule as a bound
// of the order (the slots stay sorted, ghosts included: the scan's early exits
// read b.rules[0] and b.rules[w0*64], findRule and updateBlocks search them),
// and whatever bits it left elsewhere are never read, since a scan starts
// from all. A build leaves a free slot every gapEvery rules where the words
// allow (gapSlots); a gap holds the rule before it. A removal clears the
// slot's bit in all and leaves the removed rule in the slot, up to staleMax
// per block (then every free slot gets a neighbour: sweepGhosts), so a
// removal copies no chunk of slots. An insertion takes a free slot next to
// its place in the order, shifting the slots between it and the nearest free
// one (every bitmap of the block shifts the same range of bits, the sparse
// positions in the range move by one), then gives every bitmap the bit the
// rule's term ids ask there, writing only those that differ (assign). A
// value no rule of the block's directory names, and a key that is no
// dimension of the block, leave the rule unconstrained there and verified
// whole (resid). Readers keep
// the old block: a patch copies each slice of it before its first write to it
// (a change copies a few words and one chunk of slots, not the block).

// holds reports whether slot i holds a rule of the block.
func (b *bitBlock) holds(i int) bool { return b.all[i/64]&(1<<(i%64)) != 0 }

// freeFrom returns the first slot from i up that holds no rule, n if none
// (a word of all at a time; the bits past n are clear).
func (b *bitBlock) freeFrom(i int) int {
	for w := i / 64; w < len(b.all); w++ {
		x := ^b.all[w]
		if w == i/64 {
			x &= ^uint64(0) << (i % 64)
		}
		if x != 0 {
			return min(w*64+bits.TrailingZeros64(x), b.n)
		}
	}
	return b.n
}

// freeTo returns the last slot from j down that holds no rule, -1 if none.
func (b *bitBlock) freeTo(j int) int {
	if j < 0 {
		return -1
	}
	for w := j / 64; w >= 0; w-- {
		x := ^b.all[w]
		if w == j/64 {
			x &= ^uint64(0) >> (63 - j%64)
		}
		if x != 0 {
			return w*64 + 63 - bits.LeadingZeros64(x)
		}
	}
	return -1
}

// live is the number of rules the block holds.
func (b *bitBlock) live() int {
	n := 0
	for _, w := range b.all {
		n += bits.OnesCount64(w)
	}
	return n
}

// patchBlock returns b without the rules in slots gone and with adds
// (sorted), or false if b has no room for them or an added rule has no ids
// (the caller rebuilds the block). b itself is not changed.
func patchBlock(b *bitBlock, gone []int, adds []*Rule, ids *addedIDs) (*bitBlock, bool) {
	for _, r := range adds {
		if _, ok := ids.of(r); !ok {
			return nil, false
		}
	}
	nb := new(bitBlock)
	*nb = *b // every slice shared until the patch writes it
	// The flags on the stack: a block has blockMax slots at most, and most
	// have few dimensions.
	var chunks [blockMax / slotChunk]bool
	var dims [16]dimOwned
	p := patcher{b: nb, chunks: chunks[:len(nb.rules)]}
	if len(nb.dims) <= len(dims) {
		p.dims = dims[:len(nb.dims)]
	} else {
		p.dims = make([]dimOwned, len(nb.dims))
	}
	for _, s := range gone {
		p.clear(&nb.all, &p.top, s)
	}
	// A removed rule's slot keeps it (its key is a bound of the order) until
	// staleMax such slots would keep removed rules alive; then every free
	// slot gets a neighbour.
	if nb.stale += len(gone); nb.stale > staleMax {
		p.sweepGhosts()
	}
	for _, r := range adds {
		s, ok := p.makeRoom(r)
		if !ok {
			return nil, false
		}
		rids, _ := ids.of(r)
		p.assign(s, r, rids)
	}
	// A word whose first slot now holds another rule gets its order prefix
	// (most patches leave every first slot as it was: nothing is copied).
	ownedOrds := false
	for c, written := range p.chunks {
		if written {
			if o := nb.slotOrd(c); o != nb.ords[c] {
				own(&nb.ords, &ownedOrds)
				nb.ords[c] = o
			}
		}
	}
	return nb, true
}

// staleMax bounds the free slots of a block that hold a removed rule, which
// they keep alive (block.stale).
const staleMax = 16

// sweepGhosts gives every free slot a neighbour, not a removed rule: the rule
// of the slot before it, or for the free slots before the first rule held,
// that rule (the slots stay sorted).
func (p *patcher) sweepGhosts() {
	b := p.b
	b.stale = 0
	j := -1
	for w, held := range b.all {
		if held != 0 {
			j = w*64 + bits.TrailingZeros64(held)
			break
		}
	}
	if j < 0 {
		return // no rule left: the block is dropped
	}
	// Only the free slots are visited (a block has one in gapEvery).
	prev := b.at(j)
	for w, held := range b.all {
		lo := w * 64
		if lo >= b.n {
			break
		}
		free := ^held
		if b.n-lo < 64 {
			free &= 1<<(b.n-lo) - 1
		}
		for ; free != 0; free &= free - 1 {
			i := bits.TrailingZeros64(free)
			if below := held & (1<<i - 1); below != 0 {
				prev = b.at(lo + 63 - bits.LeadingZeros64(below))
			}
			if b.at(lo+i) != prev {
				p.setRule(lo+i, prev)
			}
		}
		if held != 0 {
			prev = b.at(lo + 63 - bits.LeadingZeros64(held))
		}
	}
}

// patcher changes a copy of a block that shares every slice with the
// original until it writes one: it copies a slice on its first write (the
// flags say which it owns).
type patcher struct {
	b         *bitBlock
	chunks    []bool // of b.rules
	rules     bool   // the chunks' directory b.rules
	top       bool   // all
	resid     bool
	dimsOwned bool // b.dims, the dimensions' headers
	dims      []dimOwned
}

// dim returns dimension di of the block, to write: the dimensions' headers
// are copied on the first write to any of them (a patch that leaves every
// dimension as it was, a rule taking a slot whose bits it shares, copies
// none).
func (p *patcher) dim(di int) *bitDim {
	if !p.dimsOwned {
		p.b.dims, p.dimsOwned = slices.Clone(p.b.dims), true
	}
	return &p.b.dims[di]
}

type dimOwned struct{ any, absent, words, vids, refs, pos bool }

// own copies *ws unless owned.
func own[T any](ws *[]T, owned *bool) {
	if !*owned {
		*ws, *owned = slices.Clone(*ws), true
	}
}

// set sets bit s of *ws, copying it first if the bit changes.
func (p *patcher) set(ws *[]uint64, owned *bool, s int) {
	if (*ws)[s/64]&(1<<(s%64)) == 0 {
		own(ws, owned)
		(*ws)[s/64] |= 1 << (s % 64)
	}
}

// clear clears bit s of *ws, copying it first if the bit changes.
func (p *patcher) clear(ws *[]uint64, owned *bool, s int) {
	if (*ws)[s/64]&(1<<(s%64)) != 0 {
		own(ws, owned)
		(*ws)[s/64] &^= 1 << (s % 64)
	}
}

// setRule puts r in slot i, copying its chunk first.
func (p *patcher) setRule(i int, r *Rule) {
	p.ownChunk(i / slotChunk)[i%slotChunk] = r
}

// ownChunk returns chunk c of the slots, copying it first.
func (p *patcher) ownChunk(c int) *slots {
	own(&p.b.rules, &p.rules)
	if !p.chunks[c] {
		cp := *p.b.rules[c]
		p.b.rules[c], p.chunks[c] = &cp, true
	}
	return p.b.rules[c]
}

// grow adds a slot past the end holding r; its bits are clear.
func (p *patcher) grow(r *Rule) {
	b := p.b
	if b.n%slotChunk == 0 {
		own(&b.rules, &p.rules)
		b.rules = append(b.rules, new(slots))
		p.chunks = p.chunks[:len(p.chunks)+1] // within blockMax slots: room in the flags' array
		p.chunks[len(p.chunks)-1] = true
	}
	b.n++
	p.setRule(b.n-1, r)
}

// makeRoom returns a free slot where r (not yet in the block) can go in the
// order, shifting the slots between its place and the nearest free one (a
// free slot as found keeps the bits of the rule it held; one a shift left
// has none).
func (p *patcher) makeRoom(r *Rule) (slot int, ok bool) {
	b := p.b
	n := b.n
	i := sort.Search(n, func(i int) bool { return r.Key.Less(&b.at(i).Key) }) // r goes before slot i
	if i > 0 && !b.holds(i-1) {
		return i - 1, true
	}
	if i < n && !b.holds(i) {
		return i, true
	}
	up := b.freeFrom(i)
	if up == n && n >= min(len(b.all)*64, blockMax) {
		up = -1 // no free slot above, and no room to grow
	}
	down := b.freeTo(i - 2)
	switch {
	case up >= 0 && (down < 0 || up-i <= i-1-down):
		if up == n {
			p.grow(r)
		}
		p.clearSlot(up)
		p.shift(i, up, 1)
		return i, true
	case down >= 0:
		p.clearSlot(down)
		p.shift(down, i-1, -1)
		return i - 1, true
	}
	return 0, false
}

// shift moves slots [lo, hi) up one (delta 1: slot hi is free and cleared,
// lo becomes free) or slots (lo, hi] down one (delta -1: slot lo is free and
// cleared, hi becomes free), with every bitmap and position of the block.
func (p *patcher) shift(lo, hi, delta int) {
	if lo >= hi {
		return
	}
	b := p.b
	move := func(ws []uint64) {
		if delta > 0 {
			moveUp(ws, lo, hi)
		} else {
			moveDown(ws, lo, hi)
		}
	}
	// A bitmap with no bit in [lo, hi] stays as it is (and shared).
	moveOwned := func(ws *[]uint64, owned *bool) {
		for w := lo / 64; w <= hi/64; w++ {
			if (*ws)[w]&rangeMask(w, lo, hi) != 0 {
				own(ws, owned)
				move(*ws)
				return
			}
		}
	}
	moveOwned(&b.all, &p.top)
	moveOwned(&b.resid, &p.resid)
	nw := len(b.all)
	for di := range b.dims {
		d, o := p.dim(di), &p.dims[di] // a shift moves most dimensions' bits
		moveOwned(&d.any, &o.any)
		moveOwned(&d.absent, &o.absent)
		for off := 0; off < len(d.words); off += nw {
			seg := d.words[off : off+nw]
			for w := lo / 64; w <= hi/64; w++ {
				if seg[w]&rangeMask(w, lo, hi) != 0 {
					own(&d.words, &o.words)
					move(d.words[off : off+nw])
					break
				}
			}
		}
		// The positions that move: [lo, hi) up, (lo, hi] down; q-first
		// wraps past span for a position below first.
		first, span := uint16(lo), uint16(hi-lo-1)
		if delta < 0 {
			first++
		}
		k := 0
		for k < len(d.pos) && d.pos[k]-first > span {
			k++
		}
		if k == len(d.pos) {
			continue
		}
		own(&d.pos, &o.pos) // a shift moves positions only
		for pos := d.pos; k < len(pos); k++ {
			if pos[k]-first <= span {
				pos[k] = uint16(int(pos[k]) + delta)
			}
		}
	}
	p.moveRules(lo, hi, delta)
}

// moveRules moves the rules of slots [lo, hi) up one slot (delta 1) or of
// slots (lo, hi] down one (delta -1), a chunk at a time (the chunks written
// are copied first).
func (p *patcher) moveRules(lo, hi, delta int) {
	dlo, dhi := lo+1, hi // the slots written
	if delta < 0 {
		dlo, dhi = lo, hi-1
	}
	clo, chi := dlo/slotChunk, dhi/slotChunk
	for c := clo; c <= chi; c++ {
		p.ownChunk(c)
	}
	rs := p.b.rules
	if delta > 0 { // from the top chunk down: a chunk's last slot is read before it moves
		for c := chi; c >= clo; c-- {
			from, to := max(dlo, c*slotChunk), min(dhi, c*slotChunk+slotChunk-1)
			if f := max(from, c*slotChunk+1); f <= to { // within the chunk first
				copy(rs[c][f%slotChunk:to%slotChunk+1], rs[c][f%slotChunk-1:])
			}
			if from == c*slotChunk {
				rs[c][0] = rs[c-1][slotChunk-1]
			}
		}
		return
	}
	for c := clo; c <= chi; c++ { // from the bottom chunk up: a chunk's first slot is read before it moves
		from, to := max(dlo, c*slotChunk), min(dhi, c*slotChunk+slotChunk-1)
		if t := min(to, c*slotChunk+slotChunk-2); from <= t { // within the chunk first
			copy(rs[c][from%slotChunk:t%slotChunk+1], rs[c][from%slotChunk+1:])
		}
		if to == c*slotChunk+slotChunk-1 {
			rs[c][slotChunk-1] = rs[c+1][0]
		}
	}
}

// rangeMask is the bits of word w in slots [lo, hi].
func rangeMask(w, lo, hi int) uint64 {
	a, z := max(lo, w*64)-w*64, min(hi, w*64+63)-w*64
	return ^uint64(0) >> (63 - z) &^ (1<<a - 1)
}

// moveUp moves bits [lo, hi) of ws to [lo+1, hi] and clears bit lo.
func moveUp(ws []uint64, lo, hi int) {
	for w := hi / 64; w >= lo/64; w-- {
		x := ws[w] << 1
		if w > 0 {
			x |= ws[w-1] >> 63
		}
		m := rangeMask(w, lo, hi)
		ws[w] = ws[w]&^m | x&m
	}
	ws[lo/64] &^= 1 << (lo % 64)
}

// moveDown moves bits (lo, hi] of ws to [lo, hi) and clears bit hi.
func moveDown(ws []uint64, lo, hi int) {
	for w := lo / 64; w <= hi/64; w++ {
		x := ws[w] >> 1
		if w+1 < len(ws) {
			x |= ws[w+1] << 63
		}
		m := rangeMask(w, lo, hi)
		ws[w] = ws[w]&^m | x&m
	}
	ws[hi/64] &^= 1 << (hi % 64)
}

// clearSlot clears slot s in every bitmap and position list of the block.
func (p *patcher) clearSlot(s int) {
	b := p.b
	p.clear(&b.all, &p.top, s)
	p.clear(&b.resid, &p.resid, s)
	nw := len(b.all)
	for di := range b.dims {
		d, o := p.dim(di), &p.dims[di]         // before a shift, which writes them anyway
		listed := d.any[s/64]&(1<<(s%64)) == 0 // a listed slot is never in any
		p.clear(&d.any, &o.any, s)
		p.clear(&d.absent, &o.absent, s)
		for off := 0; off < len(d.words); off += nw {
			if d.words[off+s/64]&(1<<(s%64)) != 0 {
				own(&d.words, &o.words)
				d.words[off+s/64] &^= 1 << (s % 64)
			}
		}
		if listed {
			p.unlist(di, s, 0)
		}
	}
}

// unlist takes slot s out of the positions of every value of d but keep (0:
// none); a value whose last position leaves, leaves the directory. It finds
// s in the flat positions, then the value whose positions hold it by the
// refs alone (reading no value's positions but s's).
func (p *patcher) unlist(di, s int, keep uint32) {
	d, o := &p.b.dims[di], &p.dims[di]
	// A slot is listed under one value at most (a build lists a rule under
	// its one value of the key, assign unlists the others first): when
	// keep lists s, no other value does.
	if keep != 0 {
		if i, ok := d.find(keep); ok && d.refs[i].n != 0 {
			r := d.refs[i]
			if _, in := slices.BinarySearch(d.pos[r.off:r.off+r.n], uint16(s)); in {
				return
			}
		}
	}
	left := false // a value left the directory
	for k := slices.Index(d.pos, uint16(s)); k >= 0; {
		i := d.refAt(k)
		next := k + 1
		if d.vids[i] != keep {
			d = p.dim(di)
			own(&d.pos, &o.pos)
			own(&d.refs, &o.refs)
			d.pos = slices.Delete(d.pos, k, k+1)
			d.shiftRefs(i, -1)
			next = k
			if d.refs[i].n == 0 { // n == 0 would read as a bitmap: the value leaves the directory
				own(&d.vids, &o.vids)
				d.vids = slices.Delete(d.vids, i, i+1)
				d.refs = slices.Delete(d.refs, i, i+1)
				left = true
			}
		}
		n := slices.Index(d.pos[next:], uint16(s))
		if n < 0 {
			break
		}
		k = next + n
	}
	if left {
		d.index()
	}
}

// refAt returns the value whose positions hold d.pos[k].
func (d *bitDim) refAt(k int) int {
	for i, r := range d.refs {
		if r.n != 0 && uint32(k)-r.off < r.n {
			return i
		}
	}
	panic("index: a position no value holds")
}

// shiftRefs adds delta to the length of value i's positions and to the
// offsets of the positions after them.
func (d *bitDim) shiftRefs(i, delta int) {
	d.refs[i].n = uint32(int(d.refs[i].n) + delta)
	for k := i + 1; k < len(d.refs); k++ {
		if d.refs[k].n != 0 {
			d.refs[k].off = uint32(int(d.refs[k].off) + delta)
		}
	}
}

// dimTerm says what a rule, by its term ids rids, requires of key kid: one
// exact value (vid), the key's presence ('*'), or two values (conflict: the
// rule matches no flow).
func dimTerm(rids []idTerm, kid uint32) (vid uint32, pres, conflict bool) {
	for _, id := range rids {
		switch {
		case id.kid != kid:
		case id.vid == 0:
			pres = true
		case vid == 0:
			vid = id.vid
		case vid != id.vid:
			conflict = true
		}
	}
	return vid, pres, conflict
}

// assign puts rule r, with term ids rids, in the free slot s, giving every
// bitmap and position list the bit r's terms ask there. A bitmap whose bit
// is already as asked (left by the rule the slot held, which a policy's new
// version mostly shares) is neither written nor copied.
func (p *patcher) assign(s int, r *Rule, rids []idTerm) {
	b := p.b
	p.setRule(s, r)
	p.set(&b.all, &p.top, s)
	resid := false
	nw := len(b.all)
	for di := range b.dims {
		// d is read in place until a write (p.dim).
		d, o := &b.dims[di], &p.dims[di]
		vid, pres, conflict := dimTerm(rids, d.kid)
		if conflict { // two values of one key: the rule matches no flow
			vid = 0
		}
		// The positions of other values than vid leave s first: a value
		// whose last position leaves, leaves the directory.
		if d.any[s/64]&(1<<(s%64)) == 0 { // a listed slot is never in any
			p.unlist(di, s, vid)
			d = &b.dims[di]
		}
		any, absent, dense := false, false, -1
		switch {
		case conflict:
		case vid != 0:
			i, ok := d.find(vid)
			switch {
			case !ok: // a value of no other rule here: verified whole
				any, resid = true, true
			case d.refs[i].n == 0:
				dense = int(d.refs[i].off)
			default:
				ref := d.refs[i]
				ps := d.pos[ref.off : ref.off+ref.n]
				if j, in := slices.BinarySearch(ps, uint16(s)); !in {
					d = p.dim(di)
					own(&d.pos, &o.pos)
					own(&d.refs, &o.refs)
					d.pos = slices.Insert(d.pos, int(ref.off)+j, uint16(s))
					d.shiftRefs(i, 1)
				}
			}
		case pres:
			any = true
		default:
			any, absent = true, true
		}
		if bitOf(d.any, s) != any || bitOf(d.absent, s) != absent {
			d = p.dim(di)
			p.setTo(&d.any, &o.any, s, any)
			p.setTo(&d.absent, &o.absent, s, absent)
		}
		for off := 0; off < len(d.words); off += nw {
			if has := d.words[off+s/64]&(1<<(s%64)) != 0; has != (any || off == dense) {
				d = p.dim(di)
				own(&d.words, &o.words)
				d.words[off+s/64] ^= 1 << (s % 64)
			}
		}
	}
	// Terms of keys that are no dimension of the block: verified whole.
	for _, id := range rids {
		if !slices.ContainsFunc(b.dims, func(d bitDim) bool { return d.kid == id.kid }) {
			resid = true
			break
		}
	}
	p.setTo(&b.resid, &p.resid, s, resid)
}

// bitOf reports bit s of ws.
func bitOf(ws []uint64, s int) bool { return ws[s/64]&(1<<(s%64)) != 0 }

// setTo gives bit s of *ws the value v, copying it first if the bit changes.
func (p *patcher) setTo(ws *[]uint64, owned *bool, s int, v bool) {
	if v {
		p.set(ws, owned, s)
	} else {
		p.clear(ws, owned, s)
	}
}

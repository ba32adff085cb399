package index

import (
	"fmt"
	"slices"
	"sort"
	"unsafe"
)

// Consistency checks of the index, for the tests: each compares what an
// update left with what a build from scratch makes.

func CheckBits(ix *Index) error {
	want, live := map[*Rule]bool{}, map[*Rule]bool{}
	ix.Each(func(r *Rule) { want[r], live[r] = true, true })
	if ix.Bits.merged != ix.merged || ix.merged && len(ix.Bits.classes[1]) > 0 {
		return fmt.Errorf("bitmaps merged %v (%d DENY blocks), index merged %v", ix.Bits.merged, len(ix.Bits.classes[1]), ix.merged)
	}
	for cl, blocks := range ix.Bits.classes {
		var prev *Rule
		for bi, b := range blocks {
			if b.n > len(b.all)*64 || b.n > blockMax || len(b.rules) != (b.n+slotChunk-1)/slotChunk {
				return fmt.Errorf("class %d block %d: %d slots in %d words, %d chunks", cl, bi, b.n, len(b.all), len(b.rules))
			}
			// The scan reads every bitmap a chunk of chunkWords words at a time.
			if len(b.all)%chunkWords != 0 || len(b.resid) != len(b.all) ||
				slices.ContainsFunc(b.dims, func(d bitDim) bool { return len(d.any) != len(b.all) || len(d.absent) != len(b.all) }) {
				return fmt.Errorf("class %d block %d: bitmaps of %d words, not whole chunks of one length", cl, bi, len(b.all))
			}
			if len(b.ords) != len(b.all) {
				return fmt.Errorf("class %d block %d: %d word order prefixes, %d words", cl, bi, len(b.ords), len(b.all))
			}
			for w := range b.ords {
				if b.ords[w] != b.slotOrd(w) {
					return fmt.Errorf("class %d block %d word %d: order prefix %x, its first slot's is %x", cl, bi, w, b.ords[w], b.slotOrd(w))
				}
			}
			// Per dimension, the values whose rules hold each slot.
			in := make([]map[int][]uint32, len(b.dims))
			for di := range b.dims {
				d := &b.dims[di]
				in[di] = map[int][]uint32{}
				for _, v := range d.vids {
					eb, list := d.exact(v)
					for s := 0; s < b.n; s++ {
						if eb != nil && eb[s/64]&^d.any[s/64]&(1<<(s%64)) != 0 {
							in[di][s] = append(in[di][s], v)
						}
					}
					for _, s := range list {
						in[di][int(s)] = append(in[di][int(s)], v)
						// A patch skips the positions of a slot in any.
						if d.any[s/64]&(1<<(s%64)) != 0 {
							return fmt.Errorf("class %d block %d slot %d: listed among value %d's positions and in any", cl, bi, s, v)
						}
					}
				}
				// A patch relies on it: a slot, free or held, is listed
				// under one value of a key at most.
				for s, vs := range in[di] {
					if len(vs) > 1 && d.any[s/64]&(1<<(s%64)) == 0 {
						return fmt.Errorf("class %d block %d slot %d: listed under %d values of key %d", cl, bi, s, len(vs), d.kid)
					}
				}
			}
			held := 0
			removed := map[*Rule]bool{} // kept alive by free slots
			for s := 0; s < b.n; s++ {
				r := b.at(s)
				if prev != nil && r.Key.Less(&prev.Key) {
					return fmt.Errorf("class %d block %d slot %d: out of order", cl, bi, s)
				}
				prev = r
				if !b.holds(s) {
					if !live[r] {
						removed[r] = true
					}
					continue
				}
				held++
				if !want[r] || classOf(r) != cl && !ix.Bits.merged {
					return fmt.Errorf("class %d block %d slot %d: a rule the index does not file here (or twice)", cl, bi, s)
				}
				delete(want, r)
				if err := checkSlot(ix, b, s, r, in); err != nil {
					return fmt.Errorf("class %d block %d slot %d (%s): %w", cl, bi, s, r.ID, err)
				}
			}
			if held == 0 {
				return fmt.Errorf("class %d block %d: empty", cl, bi)
			}
			if len(removed) > b.stale || b.stale > staleMax {
				return fmt.Errorf("class %d block %d: free slots keep %d removed rules alive, %d counted (at most %d)", cl, bi, len(removed), b.stale, staleMax)
			}
			past := func(ws []uint64) bool {
				for p := b.n; p < len(ws)*64; p++ {
					if ws[p/64]&(1<<(p%64)) != 0 {
						return true
					}
				}
				return false
			}
			if past(b.all) || past(b.resid) {
				return fmt.Errorf("class %d block %d: bits past the slots", cl, bi)
			}
			for _, d := range b.dims {
				if past(d.any) || past(d.absent) {
					return fmt.Errorf("class %d block %d: bits past the slots", cl, bi)
				}
				for i, r := range d.refs {
					if r.n != 0 && !slices.IsSorted(d.pos[r.off:r.off+r.n]) {
						return fmt.Errorf("class %d block %d: positions out of order", cl, bi)
					}
					// A value's bitmap holds any's rules.
					if ws, _ := d.exact(d.vids[i]); ws != nil && (past(ws) ||
						!slices.EqualFunc(ws, d.any, func(v, a uint64) bool { return v&a == a })) {
						return fmt.Errorf("class %d block %d dimension %d value %d: its bitmap lacks rules of any, or has bits past the slots", cl, bi, d.kid, d.vids[i])
					}
				}
				want := d
				want.index()
				if !slices.Equal(d.dir, want.dir) || d.dirLo != want.dirLo || (d.dir == nil) != (want.dir == nil) {
					return fmt.Errorf("class %d block %d dimension %d: directory of %d values not what they make", cl, bi, d.kid, len(d.vids))
				}
			}
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("%d rules filed in no block", len(want))
	}
	return nil
}

// checkSlot holds slot s of b, which holds r, to r's terms; values are the
// values whose rules hold each slot, per dimension.
func checkSlot(ix *Index, b *bitBlock, s int, r *Rule, values []map[int][]uint32) error {
	resid := b.resid[s/64]&(1<<(s%64)) != 0
	rids := ix.lookupIDs(r, nil)
	bit := func(ws []uint64) bool { return ws[s/64]&(1<<(s%64)) != 0 }
	for _, id := range rids {
		if !slices.ContainsFunc(b.dims, func(d bitDim) bool { return d.kid == id.kid }) && !resid {
			return fmt.Errorf("key %d is no dimension and the rule is not verified whole", id.kid)
		}
	}
	for di, d := range b.dims {
		vid, pres, conflict := dimTerm(rids, d.kid)
		in := values[di][s] // the values whose rules hold s
		any, absent := bit(d.any), bit(d.absent)
		var ok bool
		switch {
		case conflict: // filed under no value
			ok = !any && !absent && len(in) == 0
		case vid != 0: // under its value, or verified whole
			ok = !absent && (!any && len(in) == 1 && in[0] == vid || resid && any && len(in) == 0)
		case pres:
			ok = any && !absent && len(in) == 0
		default:
			ok = any && absent && len(in) == 0
		}
		if !ok {
			return fmt.Errorf("dimension %d: any %v absent %v values %v resid %v; the rule: value %d presence %v conflict %v",
				d.kid, any, absent, in, resid, vid, pres, conflict)
		}
	}
	return nil
}

func CheckBulk(ix *Index) error {
	var rules []*Rule
	ix.Each(func(r *Rule) { rules = append(rules, r) })
	// The rules in another order than the partition's: Build must not
	// depend on it.
	slices.Reverse(rules)
	want := ix.emptyLike().Update(nil, rules)
	wantFiled := make([]uint8, len(rules))
	for i, r := range rules {
		wantFiled[i] = r.filed
	}
	got := build(rules, ix.Ends, ix.merged)
	for i, r := range rules {
		if r.filed != wantFiled[i] {
			return fmt.Errorf("rule %s of %q: filed at end %d, update files it at %d", r.ID, r.PolicyName(), r.filed, wantFiled[i])
		}
	}
	g, w := dumpIndex(got), dumpIndex(want)
	for k, v := range w {
		if g[k] != v {
			return fmt.Errorf("%s:\n got  %v\n want %v", k, g[k], v)
		}
	}
	if len(g) != len(w) {
		return fmt.Errorf("got %d lists, terms and blocks, want %d", len(g), len(w))
	}
	if got.Ends == EndSrc|EndDst {
		if err := CheckLists(got); err != nil {
			return err
		}
	}
	for _, x := range []*Index{ix, got} {
		if err := checkByEnd(x); err != nil {
			return err
		}
	}
	return checkBitsIfAny(got)
}

func checkBitsIfAny(ix *Index) error {
	if ix.Bits == nil {
		return nil
	}
	return CheckBits(ix)
}

// dumpIndex describes an index with its ids replaced by the terms they stand
// for: one line per posting list, term and bitmap block.
func dumpIndex(ix *Index) map[string]string {
	keyOf := map[uint32]termKey{}
	valOf := map[idTerm]string{}
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		keyOf[kp.kid] = tk
		kp.exact.Range(func(v string, p postings) bool {
			valOf[idTerm{kp.kid, p.vid}] = v
			return true
		})
		return true
	})
	name := func(id idTerm) string {
		tk := keyOf[id.kid]
		if id.vid == 0 {
			return fmt.Sprintf("%d:%s=*", tk.end, tk.key)
		}
		return fmt.Sprintf("%d:%s=%s", tk.end, tk.key, valOf[id])
	}
	list := func(l List) string {
		s := ""
		for _, e := range l {
			s += fmt.Sprintf("[%p %x %v %d", e.R, e.ord, e.plain, e.n)
			for _, id := range e.ids[:min(int(e.n), inlineIDs)] {
				s += " " + name(id)
			}
			s += "]"
		}
		return s
	}
	out := map[string]string{"size": fmt.Sprint(ix.Size, ix.Ends, len(keyOf), len(valOf))}
	for cl := range ix.always {
		out[fmt.Sprint("always ", cl)] = list(ix.always[cl])
	}
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		for cl := range 2 {
			out[fmt.Sprintf("%d:%s=* class %d df %d", tk.end, tk.key, cl, kp.presence.df)] = list(kp.presence.list(cl))
		}
		kp.exact.Range(func(v string, p postings) bool {
			for cl := range 2 {
				out[fmt.Sprintf("%d:%s=%s class %d df %d", tk.end, tk.key, v, cl, p.df)] = list(p.list(cl))
			}
			return true
		})
		return true
	})
	if ix.Bits == nil {
		return out
	}
	for cl, blocks := range ix.Bits.classes {
		for bi, b := range blocks {
			s := fmt.Sprint(b.n, b.all, b.resid)
			for i := 0; i < b.n; i++ {
				s += fmt.Sprintf(" %p", b.at(i))
			}
			// Dimensions and values sorted by name: their order follows
			// the ids' numbering.
			var dims []string
			for _, d := range b.dims {
				ds := fmt.Sprintf("\n %s any %v absent %v", name(idTerm{d.kid, 0}), d.any, d.absent)
				var vals []string
				for _, v := range d.vids {
					ws, pos := d.exact(v)
					vals = append(vals, fmt.Sprintf("\n  %s %v %v", name(idTerm{d.kid, v}), ws, pos))
				}
				sort.Strings(vals)
				for _, v := range vals {
					ds += v
				}
				dims = append(dims, ds)
			}
			sort.Strings(dims)
			for _, d := range dims {
				s += d
			}
			out[fmt.Sprintf("block %d/%d", cl, bi)] = s
		}
		out[fmt.Sprintf("blocks %d", cl)] = fmt.Sprint(len(blocks))
	}
	return out
}

func CheckLists(ix *Index) error {
	seen := map[*Rule]bool{}
	check := func(name string, l List, cl int, skip idTerm) error {
		for i := range l {
			e := &l[i]
			if i > 0 && e.R.Key.Less(&l[i-1].R.Key) {
				return fmt.Errorf("%s class %d: out of order at %d", name, cl, i)
			}
			if classOf(e.R) != cl {
				return fmt.Errorf("%s class %d: a rule of class %d", name, cl, classOf(e.R))
			}
			if seen[e.R] {
				return fmt.Errorf("%s: rule %s filed twice", name, e.R.ID)
			}
			seen[e.R] = true
			want := entry(e.R, skip, ix.lookupIDs(e.R, nil))
			if *e != want {
				return fmt.Errorf("%s: rule %s: entry %+v, want %+v", name, e.R.ID, *e, want)
			}
		}
		return nil
	}
	for cl, l := range ix.always {
		if err := check("always", l, cl, idTerm{}); err != nil {
			return err
		}
	}
	var err error
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		for cl := range 2 {
			if err = check(fmt.Sprintf("%d/%s", tk.end, tk.key), kp.presence.list(cl), cl, idTerm{kp.kid, 0}); err != nil {
				return false
			}
		}
		kp.exact.Range(func(v string, p postings) bool {
			for cl := range 2 {
				if err = check(fmt.Sprintf("%d/%s=%s", tk.end, tk.key, v), p.list(cl), cl, idTerm{kp.kid, p.vid}); err != nil {
					return false
				}
			}
			return true
		})
		if err == nil {
			err = checkFew(tk, kp)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if len(seen) != ix.Size {
		return fmt.Errorf("%d rules filed, size %d", len(seen), ix.Size)
	}
	if err := checkByEnd(ix); err != nil {
		return err
	}
	return checkDF(ix, seen)
}

// checkTable holds a key's value table to its exact terms: every one of
// them found with its postings, and no other, for a key of more than fewMax
// and at most tableMax values; none otherwise.
func checkTable(tk termKey, kp *keyPostings) error {
	n := kp.exact.Len()
	if (kp.table != nil) != (n > fewMax && n <= tableMax) {
		return fmt.Errorf("%d/%s: value table %v for %d exact terms", tk.end, tk.key, kp.table != nil, n)
	}
	t := kp.valueTable()
	if t == nil {
		return nil
	}
	held := 0
	for _, s := range t.slots {
		if s.p.vid != 0 {
			held++
		}
	}
	if held != n || len(t.slots) < 2*n {
		return fmt.Errorf("%d/%s: value table holds %d of %d values in %d slots", tk.end, tk.key, held, n, len(t.slots))
	}
	var err error
	kp.exact.Range(func(v string, p postings) bool {
		q, ok := t.get(v)
		if !ok || q.vid != p.vid || q.df != p.df || !sameList(q.l, p.l) {
			err = fmt.Errorf("%d/%s=%s: the value table has other postings than exact's", tk.end, tk.key, v)
		}
		return err == nil
	})
	if err == nil {
		if _, ok := t.get(tk.key + "\x00absent"); ok {
			err = fmt.Errorf("%d/%s: the value table finds a value no term has", tk.end, tk.key)
		}
	}
	return err
}

// checkFew holds a key's few values to its exact terms: each of them, with
// its postings, while they are at most fewMax, else none.
func checkFew(tk termKey, kp *keyPostings) error {
	if err := checkTable(tk, kp); err != nil {
		return err
	}
	n := kp.exact.Len()
	if n == 0 || n > fewMax {
		if kp.few != nil {
			return fmt.Errorf("%d/%s: %d few values listed for %d exact terms", tk.end, tk.key, len(kp.few), n)
		}
		return nil
	}
	if len(kp.few) != n {
		return fmt.Errorf("%d/%s: %d few values listed, %d exact terms", tk.end, tk.key, len(kp.few), n)
	}
	for i, f := range kp.few {
		if kp.fewWords[i] != valueWord(f.v) {
			return fmt.Errorf("%d/%s=%s: its word among the few values is %x, not %x", tk.end, tk.key, f.v, kp.fewWords[i], valueWord(f.v))
		}
		p, ok := kp.exact.Get(f.v)
		if !ok || p.vid != f.p.vid || p.df != f.p.df || !sameList(p.l, f.p.l) {
			return fmt.Errorf("%d/%s=%s: listed among the few values with other postings than exact's", tk.end, tk.key, f.v)
		}
	}
	return nil
}

// sameList reports whether a and b are one slice: the same array, length and
// capacity.
func sameList(a, b List) bool {
	return len(a) == len(b) && cap(a) == cap(b) && (cap(a) == 0 || &a[:cap(a)][0] == &b[:cap(b)][0])
}

// checkByEnd holds the keys listed by end to keys: every key, its own
// postings, the source's first, each end's by key id, while there are at
// most listMax keys.
func checkByEnd(ix *Index) error {
	l := ix.keyList()
	if n := ix.keys.Len(); n > listMax {
		if l.refs != nil {
			return fmt.Errorf("%d keys listed by end", n)
		}
		return nil
	}
	if len(l.refs) != ix.keys.Len() {
		return fmt.Errorf("%d keys listed by end, %d in the index", len(l.refs), ix.keys.Len())
	}
	for _, end := range [2]uint8{EndSrc, EndDst} {
		refs := l.byEnd(end)
		for i, kr := range refs {
			if kp, ok := ix.keys.Get(termKey{end, kr.key}); !ok || kp != kr.kp {
				return fmt.Errorf("end %d key %q: listed with other postings than the index holds", end, kr.key)
			}
			if i > 0 && refs[i-1].kp.kid >= kr.kp.kid {
				return fmt.Errorf("end %d key %q: listed out of key id order", end, kr.key)
			}
		}
	}
	return nil
}

// checkDF holds every term's df, with its pending change, to the rules that
// carry it; a term no rule carries may stay only while its change is pending.
func checkDF(ix *Index, rules map[*Rule]bool) error {
	want := map[term]int32{}
	var buf [8]term
	for r := range rules {
		for _, t := range ix.terms(r, buf[:0]) {
			want[t]++
		}
	}
	var err error
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		pt := term{end: tk.end, key: tk.key, presence: true}
		if kp.presence.df != want[pt] {
			err = fmt.Errorf("%v: df %d, %d rules carry it", pt, kp.presence.df, want[pt])
			return false
		}
		delete(want, pt)
		if len(kp.pend) > pendMax {
			err = fmt.Errorf("%d/%s: %d pending changes", tk.end, tk.key, len(kp.pend))
			return false
		}
		for _, x := range kp.pend {
			if _, ok := kp.exact.Get(x.v); !ok || x.d == 0 {
				err = fmt.Errorf("%d/%s=%s: a pending change %d of no term", tk.end, tk.key, x.v, x.d)
				return false
			}
		}
		kp.exact.Range(func(v string, p postings) bool {
			t := term{end: tk.end, key: tk.key, value: v}
			df := p.df + kp.pending(v)
			switch {
			case df != want[t]:
				err = fmt.Errorf("%v: df %d (%d pending), %d rules carry it", t, df, kp.pending(v), want[t])
			case df == 0 && (kp.pending(v) == 0 || !p.empty()):
				err = fmt.Errorf("%v: no rule carries it, yet it stays", t)
			}
			delete(want, t)
			return err == nil
		})
		return err == nil
	})
	if err != nil {
		return err
	}
	for t, n := range want {
		if t.end != 0 && n > 0 {
			return fmt.Errorf("%v: carried by %d rules, no entry", t, n)
		}
	}
	return nil
}

// BlockCounts returns how many bitmap blocks the index's rules are cut into,
// per action class.
func (ix *Index) BlockCounts() [2]int {
	if ix == nil || ix.Bits == nil {
		return [2]int{}
	}
	return [2]int{len(ix.Bits.classes[0]), len(ix.Bits.classes[1])}
}

// FreeSlots counts the free slots inside the index's bitmap blocks.
func (ix *Index) FreeSlots() int {
	n := 0
	if ix == nil || ix.Bits == nil {
		return 0
	}
	for _, blocks := range ix.Bits.classes {
		for _, b := range blocks {
			n += b.n - b.live()
		}
	}
	return n
}

// Digest mixes every block of the index (slots, bitmaps, directories) into mix.
func (ix *Index) Digest(mix func(uint64)) {
	if ix == nil || ix.Bits == nil {
		return
	}
	words := func(ws []uint64) {
		mix(uint64(len(ws)))
		for _, w := range ws {
			mix(w)
		}
	}
	for _, blocks := range ix.Bits.classes {
		for _, b := range blocks {
			mix(uint64(b.n))
			for i := 0; i < b.n; i++ {
				mix(uint64(uintptr(unsafe.Pointer(b.at(i)))))
			}
			words(b.all)
			words(b.resid)
			words(b.ords)
			for _, d := range b.dims {
				mix(uint64(d.kid))
				words(d.any)
				words(d.absent)
				words(d.words)
				for _, v := range d.vids {
					mix(uint64(v))
				}
				mix(uint64(d.dirLo))
				for _, x := range d.dir {
					mix(uint64(x))
				}
				for _, r := range d.refs {
					mix(uint64(r.off)<<32 | uint64(r.n))
				}
				for _, q := range d.pos {
					mix(uint64(q))
				}
			}
		}
	}
}

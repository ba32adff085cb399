package index

import (
	"cmp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/resource"
)

// A bulk build (a cold start, a resync, a Mesh or Scope change) compiles whole
// partitions from scratch. It files every rule as Index.update does on an
// empty index — under the globally rarest term, in the same lists, with the
// same ids and bitmaps (TestBuildIndexMatchesUpdate) — without update's
// per-change bookkeeping: each term is looked up once per rule that carries
// it, each class is sorted once (its lists are filled in order, so no list is
// sorted or merged), and the independent parts (partitions, the indexes of a
// partition, the bitmap blocks of an index) are built concurrently.

// Build files rules from scratch.
func Build(rules []*Rule, ends uint8) *Index { return build(rules, ends, false) }

// BuildMerged is Build for a FirstMatch order: the bitmaps hold both action
// classes in one sequence (bitIndex), which ScanFirstMatch scans once.
// ScanDenyOverrides answers on it too, by the posting lists alone.
func BuildMerged(rules []*Rule, ends uint8) *Index { return build(rules, ends, true) }

func build(rules []*Rule, ends uint8, merged bool) *Index {
	ix := newIndex(ends)
	ix.merged = merged
	if len(rules) == 0 {
		return ix
	}
	// Every term the rules carry, once; per rule its terms as slots of tv, in
	// the order ix.terms lists them.
	type bulkTerm struct {
		t      term
		df     int32
		id     idTerm
		n      [2]int32 // rules filed under it, per class
		l      List     // its lists, ALLOW's first
		nAllow int
	}
	slot := make(map[term]int32, len(rules)/4)
	tv := make([]bulkTerm, 0, len(rules)/4)
	termOf := make([]int32, 0, 3*len(rules))
	off := make([]int32, len(rules)+1)
	var buf [8]term
	for i, r := range rules {
		for _, t := range ix.terms(r, buf[:0]) {
			k, ok := slot[t]
			if !ok {
				k = int32(len(tv))
				slot[t] = k
				tv = append(tv, bulkTerm{t: t})
			}
			tv[k].df++ // per occurrence, as update counts it
			termOf = append(termOf, k)
		}
		off[i+1] = int32(len(termOf))
	}
	// The term each rule is filed under (chooseTerm over the whole set): an
	// exact term if it has one, else a presence term, the rarest first seen;
	// -1 for the always list.
	chosen := make([]int32, len(rules))
	var always [2]int
	for i, r := range rules {
		best, bestDF, bestExact := int32(-1), int32(-1), false
		for _, k := range termOf[off[i]:off[i+1]] {
			exact := !tv[k].t.presence
			if bestDF >= 0 && bestExact && !exact {
				break
			}
			if n := tv[k].df; bestDF < 0 || n < bestDF {
				best, bestDF, bestExact = k, n, exact
			}
		}
		chosen[i] = best
		if best < 0 {
			r.file(0)
			always[classOf(r)]++
		} else {
			r.file(tv[best].t.end)
			tv[best].n[classOf(r)]++
		}
	}
	// Ids: per (end, key) its key id, then the value ids of its exact terms,
	// in the order the terms were first seen.
	type bulkKey struct {
		kp    *keyPostings
		terms []int32
	}
	keySlot := make(map[termKey]int32)
	var keys []bulkKey
	for k := range tv {
		tk := termKey{tv[k].t.end, tv[k].t.key}
		ks, ok := keySlot[tk]
		if !ok {
			ks = int32(len(keys))
			keySlot[tk] = ks
			keys = append(keys, bulkKey{})
		}
		keys[ks].terms = append(keys[ks].terms, int32(k))
	}
	for i := range keys {
		kp := &keyPostings{kid: ix.nextID, presence: postings{vid: valueUnknown}}
		ix.nextID++
		for _, k := range keys[i].terms {
			if tv[k].t.presence {
				tv[k].id = idTerm{kp.kid, 0}
				continue
			}
			tv[k].id = idTerm{kp.kid, ix.nextID}
			ix.nextID++
		}
		keys[i].kp = kp
	}
	// Every rule's term ids (termIDs' order: the destination's first, exact
	// before '*' on each end), for the entries and the bitmaps.
	var ids *addedIDs
	termIDs := func() {
		if ends != EndSrc|EndDst {
			return
		}
		ids = &addedIDs{rules: rules, ids: make([][]idTerm, len(rules))}
		if len(rules) > smallAdds {
			ids.at = make(map[*Rule]int32, len(rules))
		}
		flat := make([]idTerm, 0, len(termOf))
		for i, r := range rules {
			// ix.terms' order: exact (source, destination), then per end its
			// '*' terms and its expressions' presence terms.
			ks := termOf[off[i]:off[i+1]]
			se, de := r.Src.countTerms(), r.Dst.countTerms()
			srcExact, ks := ks[:se.exact], ks[se.exact:]
			dstExact, ks := ks[:de.exact], ks[de.exact:]
			srcPresent, ks := ks[:se.present], ks[se.present+se.exprs:]
			dstPresent := ks[:de.present]
			start := len(flat)
			for _, part := range [4][]int32{dstExact, dstPresent, srcExact, srcPresent} {
				for _, k := range part {
					flat = append(flat, tv[k].id)
				}
			}
			ids.ids[i] = flat[start:len(flat):len(flat)]
			if ids.at != nil {
				ids.at[r] = int32(i)
			}
		}
	}
	// Each class sorted once, the order prefix deciding most comparisons:
	// the bitmap blocks of a class are cut from it, and the lists filled in
	// its order are sorted.
	type sortKey struct {
		ord uint64
		i   int32
	}
	var byOrd [2][]sortKey
	for i, r := range rules {
		byOrd[classOf(r)] = append(byOrd[classOf(r)], sortKey{orderPrefix(&r.Key), int32(i)})
	}
	var sorted [2][]int32
	order := func() {
		for cl := range byOrd {
			slices.SortFunc(byOrd[cl], func(a, b sortKey) int {
				switch {
				case a.ord != b.ord:
					return cmp.Compare(a.ord, b.ord)
				case rules[a.i].Key.Less(&rules[b.i].Key):
					return -1
				case rules[b.i].Key.Less(&rules[a.i].Key):
					return 1
				}
				return cmp.Compare(a.i, b.i)
			})
			sorted[cl] = make([]int32, len(byOrd[cl]))
			for j, k := range byOrd[cl] {
				sorted[cl][j] = k.i
			}
		}
	}
	// Every rule's posting entry, made in the rules' order (the order of
	// their allocation: the lists below visit them in the rule order, which
	// jumps through memory).
	ents := make([]posting, len(rules))
	entries := func() {
		termIDs()
		for i, r := range rules {
			var rids []idTerm
			if ids != nil {
				rids = ids.ids[i]
			}
			skip := idTerm{}
			if k := chosen[i]; k >= 0 {
				skip = tv[k].id
			}
			ents[i] = entry(r, skip, rids)
		}
	}
	// The order and the entries are independent: made concurrently.
	Parallel(2, func(i int) {
		if i == 0 {
			order()
		} else {
			entries()
		}
	})
	var jobs []blockJob
	if ends == EndSrc|EndDst {
		ix.Bits = &bitIndex{merged: merged}
		jobs = ix.Bits.jobs(rules, sorted)
	}
	lists := func() {
		// A term's two lists share one slice: ALLOW's its length, DENY's
		// the rest of its capacity (postings.list).
		for k := range tv {
			if n := tv[k].n[classAllow] + tv[k].n[classDeny]; n > 0 {
				tv[k].l = make(List, 0, n)
			}
		}
		for cl := range sorted {
			if always[cl] > 0 {
				ix.always[cl] = make(List, 0, always[cl])
			}
			for _, i := range sorted[cl] {
				if k := chosen[i]; k < 0 {
					ix.always[cl] = append(ix.always[cl], ents[i])
				} else {
					tv[k].l = append(tv[k].l, ents[i])
				}
			}
			if cl == classAllow {
				for k := range tv {
					tv[k].nAllow = len(tv[k].l)
				}
			}
		}
		kb := ix.keys.Builder()
		for i := range keys {
			kp := keys[i].kp
			eb := pmap.New[string, postings](pmap.StringHash).Builder()
			for _, k := range keys[i].terms {
				bt := &tv[k]
				p := postings{df: bt.df, vid: bt.id.vid}
				if bt.l != nil {
					p.l = bt.l[:bt.nAllow:len(bt.l)]
				}
				if bt.t.presence {
					kp.presence.df, kp.presence.l = p.df, p.l
					continue
				}
				eb.Set(bt.t.value, p)
			}
			kp.setExact(eb.Map())
			first := tv[keys[i].terms[0]].t
			kb.Set(termKey{first.end, first.key}, kp)
		}
		ix.keys = kb.Map()
	}
	// The blocks and the lists concurrently (buildBlock reads nothing of ix
	// when ids holds every rule); the lists last, so that a helper freed
	// meanwhile finds blocks to build.
	Parallel(len(jobs)+1, func(j int) {
		if j == len(jobs) {
			lists()
			return
		}
		jb := &jobs[j]
		ix.Bits.classes[jb.cl][jb.bi] = ix.buildBlock(jb.rules, ids)
	})
	ix.Size = len(rules)
	return ix
}

// blockJob is one bitmap block a bulk build makes.
type blockJob struct {
	cl, bi int
	rules  []*Rule
}

// jobs cuts every class (sorted: the class's rules in order) into blocks as
// chunk cuts them, and makes room for them in bits.
func (bits *bitIndex) jobs(rules []*Rule, sorted [2][]int32) []blockJob {
	if bits.merged {
		sorted = [2][]int32{mergeSorted(rules, sorted[0], sorted[1])}
	}
	var jobs []blockJob
	for cl := range sorted {
		if len(sorted[cl]) == 0 {
			continue
		}
		list := make([]*Rule, len(sorted[cl]))
		for j, i := range sorted[cl] {
			list[j] = rules[i]
		}
		k := (len(list) + blockFill - 1) / blockFill
		bits.classes[cl] = make([]*bitBlock, k)
		for i := 0; i < k; i++ {
			jobs = append(jobs, blockJob{cl, i, list[len(list)*i/k : len(list)*(i+1)/k]})
		}
	}
	return jobs
}

// mergeSorted merges two sorted lists of rules (their indexes in rules)
// into one. Rules of equal keys (a from and a to item of one policy, on
// different sides) keep the order of rules, as in each list.
func mergeSorted(rules []*Rule, a, b []int32) []int32 {
	out := make([]int32, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		ra, rb := &rules[a[0]].Key, &rules[b[0]].Key
		if rb.Less(ra) || !ra.Less(rb) && b[0] < a[0] {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// termCounts are the terms of one end a matcher gives Index.terms.
type termCounts struct{ exact, present, exprs int }

func (m *Matcher) countTerms() termCounts {
	if m == nil {
		return termCounts{}
	}
	c := termCounts{exact: len(m.Exact), present: len(m.Present)}
	for i := range m.Exprs {
		switch m.Exprs[i].Op {
		case resource.OpIn, resource.OpExists, resource.OpPrefix, resource.OpCIDR:
			c.exprs++
		}
	}
	return c
}

// helpers counts the goroutines parallel runs beside its callers, over every
// call: nested calls (partitions, their indexes, an index's blocks) share one
// bound.
var helpers atomic.Int32

// Parallel calls f(0), ..., f(n-1) and returns when every call has returned.
// The caller makes calls itself; before each call, a goroutine of the call
// starts one more to help while calls are left and fewer than GOMAXPROCS-1
// help in the whole process, so nested calls never run more than GOMAXPROCS
// calls at once and a helper freed by one call is taken up by another. The
// calls must not depend on one another's order.
func Parallel(n int, f func(int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var work func()
	work = func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			if i+1 < n && acquireHelper() {
				wg.Go(func() {
					defer helpers.Add(-1)
					work()
				})
			}
			f(i)
		}
	}
	work()
	wg.Wait()
}

func acquireHelper() bool {
	limit := int32(runtime.GOMAXPROCS(0) - 1)
	for {
		h := helpers.Load()
		if h >= limit {
			return false
		}
		if helpers.CompareAndSwap(h, h+1) {
			return true
		}
	}
}

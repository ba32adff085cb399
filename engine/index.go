package engine

import (
	"sort"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
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
	endSrc uint8 = 1 << iota
	endDst
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
	key      string
	value    string
	presence bool
}

type plist []*rule

type keyPostings struct {
	presence plist
	exact    pmap.Map[string, plist]
}

type ruleIndex struct {
	keys   pmap.Map[termKey, *keyPostings]
	always plist
	size   int
	ends   uint8
}

func newIndex(ends uint8) *ruleIndex {
	return &ruleIndex{keys: pmap.New[termKey, *keyPostings](termKeyHash), ends: ends}
}

func sortPlist(l plist) {
	sort.Slice(l, func(i, j int) bool { return l[i].key.less(&l[j].key) })
}

// buildIndex files rules from scratch.
func buildIndex(rules []*rule, ends uint8) *ruleIndex {
	ix := newIndex(ends)
	return ix.update(nil, rules)
}

// listLen returns the length of the list a term names, counting additions
// pending in the current update.
func listLen(t term, kb *pmap.Builder[termKey, *keyPostings], pending map[term]int) int {
	n := pending[t]
	kp, ok := kb.Get(termKey{t.end, t.key})
	if !ok {
		return n
	}
	if t.presence {
		return n + len(kp.presence)
	}
	l, _ := kp.exact.Get(t.value)
	return n + len(l)
}

// terms lists the terms a rule could be filed under: exact terms, then presence
// terms, of the ends the index covers.
func (ix *ruleIndex) terms(r *rule, out []term) []term {
	for _, side := range [2]struct {
		end uint8
		m   *matcher
	}{{endSrc, r.src}, {endDst, r.dst}} {
		if side.m == nil || ix.ends&side.end == 0 {
			continue
		}
		for _, kv := range side.m.exact {
			out = append(out, term{end: side.end, key: kv.k, value: kv.v})
		}
	}
	for _, side := range [2]struct {
		end uint8
		m   *matcher
	}{{endSrc, r.src}, {endDst, r.dst}} {
		if side.m == nil || ix.ends&side.end == 0 {
			continue
		}
		for _, k := range side.m.present {
			out = append(out, term{end: side.end, key: k, presence: true})
		}
		for i := range side.m.exprs {
			switch e := &side.m.exprs[i]; e.op {
			case OpIn, OpExists, OpPrefix, OpCIDR:
				out = append(out, term{end: side.end, key: e.key, presence: true})
			}
		}
	}
	return out
}

// chooseTerm picks the term a rule is filed under: an exact term if it has one,
// else a presence term, else the always list; among several, the one whose list
// is shortest now.
func (ix *ruleIndex) chooseTerm(r *rule, kb *pmap.Builder[termKey, *keyPostings], pending map[term]int) term {
	var buf [8]term
	best, bestLen, bestExact := term{}, -1, false
	for _, t := range ix.terms(r, buf[:0]) {
		exact := !t.presence
		if bestLen >= 0 && bestExact && !exact {
			break // exact terms come first
		}
		if n := listLen(t, kb, pending); bestLen < 0 || n < bestLen {
			best, bestLen, bestExact = t, n, exact
		}
	}
	return best
}

// locate finds the term a filed rule is under (rules do not store it: a rule has
// few candidate terms and each list is sorted, so a binary search per term finds it).
func (ix *ruleIndex) locate(r *rule, kb *pmap.Builder[termKey, *keyPostings]) (term, bool) {
	var buf [8]term
	for _, t := range append(ix.terms(r, buf[:0]), term{}) {
		var l plist
		if t.end == 0 {
			l = ix.always
		} else if kp, ok := kb.Get(termKey{t.end, t.key}); ok {
			if t.presence {
				l = kp.presence
			} else {
				l, _ = kp.exact.Get(t.value)
			}
		}
		// Keys are unique within a side; a from and a to item of one policy may
		// share one, so look through the run of equal keys.
		for i := sort.Search(len(l), func(i int) bool { return !l[i].key.less(&r.key) }); i < len(l) && !r.key.less(&l[i].key); i++ {
			if l[i] == r {
				return t, true
			}
		}
	}
	return term{}, false
}

// update returns an index without the removed rules and with the added ones.
// The receiver is not changed. Removed rules are located by their terms and key.
func (ix *ruleIndex) update(removed, added []*rule) *ruleIndex {
	if len(removed) == 0 && len(added) == 0 {
		return ix
	}
	out := &ruleIndex{ends: ix.ends, size: ix.size, always: ix.always}
	kb := ix.keys.Builder()
	type change struct{ add, del []*rule }
	byKey := map[termKey]map[term]*change{}
	var always change
	get := func(t term) *change {
		if t.end == 0 {
			return &always
		}
		tk := termKey{t.end, t.key}
		m := byKey[tk]
		if m == nil {
			m = map[term]*change{}
			byKey[tk] = m
		}
		c := m[t]
		if c == nil {
			c = &change{}
			m[t] = c
		}
		return c
	}
	for _, r := range removed {
		t, ok := ix.locate(r, kb)
		if !ok {
			continue // not filed here: nothing to remove
		}
		c := get(t)
		c.del = append(c.del, r)
		out.size--
	}
	// Terms are chosen against the lists as they are plus the additions made so
	// far, so a bulk load spreads rules instead of piling them on one term.
	pending := map[term]int{}
	for _, r := range added {
		t := ix.chooseTerm(r, kb, pending)
		r.filed = t.end // rules are fresh here: filed in this index only
		pending[t]++
		c := get(t)
		c.add = append(c.add, r)
		out.size++
	}
	out.always = mergeList(out.always, always.del, always.add)
	for tk, changes := range byKey {
		var nkp keyPostings
		if kp, ok := kb.Get(tk); ok {
			nkp = *kp
		} else {
			nkp.exact = pmap.New[string, plist](pmap.StringHash)
		}
		eb := nkp.exact.Builder()
		for t, c := range changes {
			if t.presence {
				nkp.presence = mergeList(nkp.presence, c.del, c.add)
				continue
			}
			l, _ := eb.Get(t.value)
			if l = mergeList(l, c.del, c.add); len(l) == 0 {
				eb.Delete(t.value)
			} else {
				eb.Set(t.value, l)
			}
		}
		nkp.exact = eb.Map()
		if len(nkp.presence) == 0 && nkp.exact.Len() == 0 {
			kb.Delete(tk)
		} else {
			kb.Set(tk, &nkp)
		}
	}
	out.keys = kb.Map()
	return out
}

// mergeList returns a new sorted list: l without del, with add.
func mergeList(l plist, del, add []*rule) plist {
	if len(del) == 0 && len(add) == 0 {
		return l
	}
	gone := make(map[*rule]struct{}, len(del))
	for _, r := range del {
		gone[r] = struct{}{}
	}
	adds := append([]*rule(nil), add...)
	sortPlist(adds)
	out := make(plist, 0, len(l)+len(adds)-len(del))
	i := 0
	for _, r := range l {
		if _, ok := gone[r]; ok {
			continue
		}
		for i < len(adds) && adds[i].key.less(&r.key) {
			out = append(out, adds[i])
			i++
		}
		out = append(out, r)
	}
	out = append(out, adds[i:]...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// collect appends to lists every posting list the tags of one end can reach.
func (ix *ruleIndex) collect(end uint8, tags Tags, lists []plist) []plist {
	if ix.keys.Len() == 0 {
		return lists
	}
	for k, v := range tags {
		kp, ok := ix.keys.GetHashed(termKey{end, k}, termKeyHash(termKey{end, k}))
		if !ok {
			continue
		}
		if len(kp.presence) > 0 {
			lists = append(lists, kp.presence)
		}
		if kp.exact.Len() > 0 {
			if l, ok := kp.exact.Get(v); ok {
				lists = append(lists, l)
			}
		}
	}
	return lists
}

// lists returns every posting list a flow can reach.
func (ix *ruleIndex) lists(src, dst Tags, lists []plist) []plist {
	if len(ix.always) > 0 {
		lists = append(lists, ix.always)
	}
	if ix.ends&endSrc != 0 {
		lists = collect(ix, endSrc, src, lists)
	}
	if ix.ends&endDst != 0 {
		lists = collect(ix, endDst, dst, lists)
	}
	return lists
}

func collect(ix *ruleIndex, end uint8, tags Tags, lists []plist) []plist {
	return ix.collect(end, tags, lists)
}

// each calls f for every rule in the index, list by list.
func (ix *ruleIndex) each(f func(*rule)) {
	for _, r := range ix.always {
		f(r)
	}
	ix.keys.Range(func(_ termKey, kp *keyPostings) bool {
		for _, r := range kp.presence {
			f(r)
		}
		kp.exact.Range(func(_ string, l plist) bool {
			for _, r := range l {
				f(r)
			}
			return true
		})
		return true
	})
}

package engine

import (
	"fmt"
	"slices"
	"sort"
)

// CheckBulkIndexes holds the bulk build of every index of s (buildIndex) to
// update on an empty index, which files rules one change at a time: the same
// rules in the same lists in the same order, the same df, entries and bitmap
// blocks, each rule filed at the same end. Ids are compared by the terms
// they stand for (their numbering may differ). It returns the rules compared
// and the first difference.
func CheckBulkIndexes(s *Snapshot) (int, error) {
	n := 0
	var err error
	s.meshes.Range(func(mesh string, ms *meshState) bool {
		indexes := []*ruleIndex{ms.scopes.index}
		ms.types.Range(func(_ string, ts *typeState) bool {
			indexes = append(indexes, ts.rules, ts.attachIn, ts.attachOut,
				ts.audit.rules, ts.audit.attachIn, ts.audit.attachOut)
			return true
		})
		for _, ix := range indexes {
			if err = checkBulk(ix); err != nil {
				err = fmt.Errorf("mesh %s: %w", mesh, err)
				return false
			}
			n += ix.size
		}
		return true
	})
	return n, err
}

func checkBulk(ix *ruleIndex) error {
	var rules []*rule
	ix.each(func(r *rule) { rules = append(rules, r) })
	// The rules in another order than the partition's: buildIndex must not
	// depend on it.
	slices.Reverse(rules)
	want := newIndex(ix.ends).update(nil, rules)
	wantFiled := make([]uint8, len(rules))
	for i, r := range rules {
		wantFiled[i] = r.filed
	}
	got := buildIndex(rules, ix.ends)
	for i, r := range rules {
		if r.filed != wantFiled[i] {
			return fmt.Errorf("rule %s of %q: filed at end %d, update files it at %d", r.id, r.policyName(), r.filed, wantFiled[i])
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
	if got.ends == endSrc|endDst {
		if err := checkLists(got); err != nil {
			return err
		}
	}
	return checkBitsIfAny(got)
}

func checkBitsIfAny(ix *ruleIndex) error {
	if ix.bits == nil {
		return nil
	}
	return checkBits(ix)
}

// dumpIndex describes an index with its ids replaced by the terms they stand
// for: one line per posting list, term and bitmap block.
func dumpIndex(ix *ruleIndex) map[string]string {
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
	list := func(l plist) string {
		s := ""
		for _, e := range l {
			s += fmt.Sprintf("[%p %x %v %d", e.r, e.ord, e.plain, e.n)
			for _, id := range e.ids[:min(int(e.n), inlineIDs)] {
				s += " " + name(id)
			}
			s += "]"
		}
		return s
	}
	out := map[string]string{"size": fmt.Sprint(ix.size, ix.ends, len(keyOf), len(valOf))}
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
	if ix.bits == nil {
		return out
	}
	for cl, blocks := range ix.bits.classes {
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

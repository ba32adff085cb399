package pmap

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// Diff reports exactly the keys whose entries differ, for maps that share
// structure (one derived from the other) and for maps that share none.
func TestDiff(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		n := r.IntN(3000)
		a := New[string, int](StringHash)
		ref := map[string]int{}
		b := a.Builder()
		for i := 0; i < n; i++ {
			k := fmt.Sprint("k", r.IntN(4000))
			b.Set(k, i)
			ref[k] = i
		}
		a = b.Map()
		// derive: a few sets and deletes
		nb := a.Builder()
		next := maps.Clone(ref)
		for i, m := 0, r.IntN(8); i < m; i++ {
			k := fmt.Sprint("k", r.IntN(4000))
			if r.IntN(2) == 0 {
				nb.Delete(k)
				delete(next, k)
			} else {
				nb.Set(k, -i)
				next[k] = -i
			}
		}
		c := nb.Map()
		fresh := New[string, int](StringHash).Builder()
		for k, v := range next {
			fresh.Set(k, v)
		}
		for o, other := range []Map[string, int]{c, fresh.Map()} {
			got := map[string]bool{}
			Diff(a, other, func(x, y int) bool { return x == y }, func(k string) { got[k] = true })
			var want []string
			for k := range union(ref, next) {
				if v, ok := ref[k]; !ok || next[k] != v || !has(next, k) {
					want = append(want, k)
				}
			}
			var extra []string
			for k := range got {
				if v, ok := ref[k]; ok && has(next, k) && next[k] == v {
					extra = append(extra, k) // reported yet equal
				}
			}
			for _, k := range want {
				if !got[k] {
					t.Fatalf("round %d: %s differs, not reported", round, k)
				}
			}
			// A derived map shares every node off the changed paths: the
			// equal keys reported are the few beside a change.
			if o == 0 && len(extra) > 64 {
				t.Fatalf("round %d: %d equal keys reported for a derived map: %v", round, len(extra), slices.Sorted(slices.Values(extra)))
			}
		}
	}
}

func has(m map[string]int, k string) bool { _, ok := m[k]; return ok }

func union(a, b map[string]int) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

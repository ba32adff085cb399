package resource

import (
	"sort"
	"strings"
)

// NearestNames returns up to n of names nearest to s by edit distance
// (case-insensitive, a transposition counting one), nearest first, ties by
// name; only names close enough to be a typo of s (a distance of at most a
// third of the longer name's length, and at least 2) and at most one edit
// farther than the nearest.
func NearestNames(s string, names []string, n int) []string {
	type cand struct {
		name string
		d    int
	}
	ls := strings.ToLower(s)
	seen := map[string]bool{}
	var cs []cand
	for _, name := range names {
		if seen[name] || name == s {
			continue
		}
		seen[name] = true
		max := max(len(name), len(s)) / 3
		if max < 2 {
			max = 2
		}
		if d := editDistance(ls, strings.ToLower(name)); d <= max {
			cs = append(cs, cand{name, d})
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].d != cs[j].d {
			return cs[i].d < cs[j].d
		}
		return cs[i].name < cs[j].name
	})
	var out []string
	for i := 0; i < len(cs) && i < n && cs[i].d <= cs[0].d+1; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

// editDistance is the optimal string alignment distance between a and b, by
// bytes: insertions, deletions, substitutions and adjacent transpositions.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

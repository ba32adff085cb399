package index

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestOrderPrefixKeepsTheOrder: the one-expression prefix equals the clamped
// one field by field, and on random keys — at, inside and past every field's
// bounds — a smaller prefix means an earlier key and an earlier key never
// has a greater prefix.
func TestOrderPrefixKeepsTheOrder(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	pick32 := func(lo, hi int64) int32 {
		vals := []int64{lo - 1, lo, lo + 1, -1, 0, 1, 2, 3, hi - 1, hi, hi + 1, math.MinInt32, math.MaxInt32}
		return int32(vals[r.IntN(len(vals))])
	}
	pick16 := func(lo, hi int64) int16 {
		vals := []int64{-hi - 1, -hi, -hi + 1, -1, 0, 1, 2, 6, -lo - 1, -lo, -lo + 1, math.MinInt16, math.MaxInt16}
		return int16(vals[r.IntN(len(vals))])
	}
	key := func() OrderKey {
		return OrderKey{
			Phase:    uint8(r.IntN(3)),
			Scope:    pick32(prefixScopeLo, prefixScopeHi),
			Priority: pick32(prefixPriorityLo, prefixPriorityHi),
			Total:    pick16(prefixRankLo, prefixRankHi),
			Exact:    pick16(prefixRankLo, prefixRankHi),
			Tb1:      int64(r.IntN(3)),
			Item:     int32(r.IntN(3)),
		}
	}
	for range 200_000 {
		a, b := key(), key()
		pa, pb := orderPrefix(&a), orderPrefix(&b)
		if c := orderPrefixClamped(&a); pa != c {
			t.Fatalf("%+v: prefix %x, clamped field by field %x", a, pa, c)
		}
		if pa < pb && !a.Less(&b) || a.Less(&b) && pa > pb {
			t.Fatalf("%+v (prefix %x) and %+v (prefix %x): the prefixes do not keep the order", a, pa, b, pb)
		}
	}
}

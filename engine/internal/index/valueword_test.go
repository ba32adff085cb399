package index

import (
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
)

// TestValueWordIsTheFirstBytes holds valueWord's overlapping loads to its
// definition, a value's first bytes (up to 8) little-endian with its length
// in the top byte, on every length around the loads' sizes.
func TestValueWordIsTheFirstBytes(t *testing.T) {
	const src = "abcdefghijklmnopqrstuvwxyz0123456789"
	for n := 0; n <= 20; n++ {
		for off := 0; off+n <= len(src); off += 7 {
			v := src[off : off+n]
			var want uint64
			for i := range min(n, 8) {
				want |= uint64(v[i]) << (8 * i)
			}
			want ^= uint64(n) << 56
			if got := valueWord(v); got != want {
				t.Errorf("valueWord(%q) = %#x, want %#x", v, got, want)
			}
		}
	}
}

// TestFewValuesCompareLengths holds a key of few values to whole values: a
// long value's word (its first 8 bytes, its length's low byte in the top
// one) can equal a short value's, which the word alone would take for it.
func TestFewValuesCompareLengths(t *testing.T) {
	long := "abcdefg`" + strings.Repeat("x", 103-8) // '`' ^ 103 = 7, a 7-byte value's top byte
	short := "abcdefg"
	if valueWord(long) != valueWord(short) {
		t.Fatal("the case needs two values of one word")
	}
	for _, tc := range []struct {
		name   string
		values []string
		flow   string
		want   uint32 // the flow's value id
	}{
		{"short value, long one filed", []string{long}, short, valueUnknown},
		{"long value, short one filed", []string{short}, long, valueUnknown},
		{"both filed, short asked", []string{long, short}, short, firstID + 1},
		{"both filed, long asked", []string{long, short}, long, firstID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := pmap.New[string, postings](pmap.StringHash)
			for i, v := range tc.values {
				m = m.Set(v, postings{vid: firstID + uint32(i)})
			}
			var kp keyPostings
			kp.kid = 1
			kp.setExact(m)
			var vals flowVals
			vals.reset(2)
			var rc reached
			kp.reachValue(tc.flow, &rc, &vals)
			if got := uint32(vals.vals[1]); got != tc.want {
				t.Errorf("value id %d, want %d", got, tc.want)
			}
		})
	}
}

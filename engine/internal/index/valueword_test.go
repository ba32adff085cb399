package index

import "testing"

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

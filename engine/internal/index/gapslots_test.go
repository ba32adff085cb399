package index

import "testing"

// TestGapSlots: a built block lays its rules out in order, slot 0 first,
// within the words its rules need and blockMax, with the free slots it can
// afford spread between them: no run of held slots longer than the rules per
// gap (rounded up), so an insertion finds a free slot nearby.
func TestGapSlots(t *testing.T) {
	t.Parallel()
	for n := 1; n <= blockMax; n++ {
		slotOf, slots := gapSlots(n)
		gaps := min(n/gapEvery, words(n)*64-n, blockMax-n)
		if slots != n+gaps || slots > words(n)*64 || slots > blockMax {
			t.Fatalf("n=%d: %d slots, %d gaps, %d words", n, slots, gaps, words(n))
		}
		if slotOf(0) != 0 || slotOf(n-1) != slots-1 {
			t.Fatalf("n=%d: first slot %d, last %d of %d", n, slotOf(0), slotOf(n-1), slots)
		}
		run, longest := 1, 1
		for i := 1; i < n; i++ {
			switch d := slotOf(i) - slotOf(i-1); d {
			case 1:
				run++
			case 2:
				run = 1
			default:
				t.Fatalf("n=%d: rule %d is %d slots after the one before", n, i, d)
			}
			longest = max(longest, run)
		}
		if gaps > 0 && longest > (n+gaps-1)/gaps {
			t.Fatalf("n=%d, %d gaps: %d rules in a row", n, gaps, longest)
		}
	}
}

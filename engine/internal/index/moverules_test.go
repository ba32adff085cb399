package index

import (
	"math/rand/v2"
	"testing"
)

// TestMoveRulesMatchesSlotBySlot: a patch's shift of slots [lo, hi) up or
// (lo, hi] down, moved a chunk at a time, leaves every slot as moving one
// slot at a time does, copies the chunks it writes and no other, and leaves
// the block it patches unchanged.
func TestMoveRulesMatchesSlotBySlot(t *testing.T) {
	t.Parallel()
	const n = 4 * slotChunk
	rules := make([]*Rule, n)
	for i := range rules {
		rules[i] = &Rule{}
	}
	for _, delta := range []int{1, -1} {
		for lo := 0; lo < n; lo++ {
			for hi := lo + 1; hi < n; hi++ {
				b := &bitBlock{rules: chunkSlots(rules), n: n}
				nb := *b
				nb.rules = append([]*slots(nil), b.rules...)
				p := &patcher{b: &nb, chunks: make([]bool, len(nb.rules))}
				p.moveRules(lo, hi, delta)
				want := append([]*Rule(nil), rules...)
				if delta > 0 {
					for i := hi; i > lo; i-- {
						want[i] = want[i-1]
					}
				} else {
					for i := lo; i < hi; i++ {
						want[i] = want[i+1]
					}
				}
				dlo, dhi := lo+1, hi
				if delta < 0 {
					dlo, dhi = lo, hi-1
				}
				for i := range want {
					if nb.at(i) != want[i] {
						t.Fatalf("delta %d, [%d, %d]: slot %d holds the wrong rule", delta, lo, hi, i)
					}
					if b.at(i) != rules[i] {
						t.Fatalf("delta %d, [%d, %d]: the old block's slot %d changed", delta, lo, hi, i)
					}
				}
				for c := range nb.rules {
					written := c >= dlo/slotChunk && c <= dhi/slotChunk
					if p.chunks[c] != written || (nb.rules[c] != b.rules[c]) != written {
						t.Fatalf("delta %d, [%d, %d]: chunk %d copied %v, written %v", delta, lo, hi, c, p.chunks[c], written)
					}
				}
			}
		}
	}
}

// TestFreeSlotsMatchSlotBySlot: freeFrom and freeTo, a word at a time, find
// the free slot a walk slot by slot finds.
func TestFreeSlotsMatchSlotBySlot(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 200; round++ {
		n := 1 + r.IntN(5*64)
		b := &bitBlock{n: n, all: make([]uint64, (n+63)/64+r.IntN(2))}
		dense := r.IntN(4) != 0 // mostly held, as blocks are
		for s := 0; s < n; s++ {
			if !dense || r.IntN(50) != 0 {
				if dense || r.IntN(2) == 0 {
					b.all[s/64] |= 1 << (s % 64)
				}
			}
		}
		for i := 0; i <= n; i++ {
			up := i
			for up < n && b.holds(up) {
				up++
			}
			if got := b.freeFrom(i); got != up {
				t.Fatalf("n %d: freeFrom(%d) = %d, want %d", n, i, got, up)
			}
			down := i - 2
			for down >= 0 && b.holds(down) {
				down--
			}
			if got := b.freeTo(i - 2); got != max(down, -1) {
				t.Fatalf("n %d: freeTo(%d) = %d, want %d", n, i-2, got, down)
			}
		}
	}
}

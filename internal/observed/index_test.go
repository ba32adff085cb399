package observed

import (
	"math/rand/v2"
	"testing"
)

// TestFlowIndexAgreesWithAMap: random puts and removes, with fingerprints
// crowded onto few homes so probes wrap and removals shift runs back, answer
// every get as a map does, and the count follows.
func TestFlowIndexAgreesWithAMap(t *testing.T) {
	t.Parallel()
	for _, homes := range []uint64{4, 64, 1 << 20} {
		r := rand.New(rand.NewPCG(homes, 7))
		var x flowIndex
		model := map[flowFP]int32{}
		var held []flowFP
		for step := range 5_000 {
			if len(held) > 0 && r.IntN(100) < 45 {
				k := r.IntN(len(held))
				fp := held[k]
				held[k] = held[len(held)-1]
				held = held[:len(held)-1]
				x.remove(fp)
				delete(model, fp)
			} else {
				fp := flowFP(r.Uint64N(homes) | r.Uint64()<<32)
				if _, ok := model[fp]; ok {
					continue
				}
				e := int32(step)
				x.put(fp, e)
				model[fp] = e
				held = append(held, fp)
			}
			if x.n != len(model) {
				t.Fatalf("homes %d step %d: %d held, want %d", homes, step, x.n, len(model))
			}
			if step%97 == 0 {
				for fp, e := range model {
					if got, ok := x.get(fp); !ok || got != e {
						t.Fatalf("homes %d step %d: get %v = %d, %v; want %d", homes, step, fp, got, ok, e)
					}
				}
				gone := flowFP(r.Uint64N(homes) | r.Uint64()<<32)
				if _, ok := model[gone]; !ok {
					if _, ok := x.get(gone); ok {
						t.Fatalf("homes %d step %d: a fingerprint never put is found", homes, step)
					}
				}
			}
		}
	}
}

package loadtest

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func TestHistogramQuantilesWithinPrecision(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 1))
	var h Histogram
	vals := make([]int64, 100000)
	for i := range vals {
		// log-uniform from 100 ns to 100 ms
		vals[i] = int64(100 * math.Pow(10, r.Float64()*6))
		h.Record(time.Duration(vals[i]))
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := int64(h.Quantile(q))
		if got < exact || float64(got) > float64(exact)*1.02 {
			t.Errorf("p%v = %d, exact %d: outside [exact, exact*1.02]", q*100, got, exact)
		}
	}
	if h.Max() != time.Duration(vals[len(vals)-1]) || h.Count() != uint64(len(vals)) {
		t.Errorf("max %v count %d", h.Max(), h.Count())
	}
}

func TestHistogramMergeAndSmallValues(t *testing.T) {
	t.Parallel()
	var a, b Histogram
	for i := 1; i <= 50; i++ {
		a.Record(time.Duration(i))
		b.Record(time.Duration(i + 50))
	}
	a.Merge(&b)
	if a.Count() != 100 || a.Quantile(0.5) != 50 || a.Quantile(1) != 100 {
		t.Fatalf("count %d p50 %v p100 %v", a.Count(), a.Quantile(0.5), a.Quantile(1))
	}
}

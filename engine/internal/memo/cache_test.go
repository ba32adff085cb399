package memo

import (
	"testing"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// decision stands for the engine's answers.
type decision struct {
	Action resource.Action
	Policy string
}

// TestCacheVerifiesEveryField: an entry found under a flow's hash answers only
// that exact flow; a colliding hash is a miss, never another flow's answer.
func TestCacheVerifiesEveryField(t *testing.T) {
	t.Parallel()
	base := index.Flow{Src: resource.Tags{"app": "web"}, Dst: resource.Tags{"app": "db", "env": "prod"}, Proto: resource.TCP, Port: 5432}
	const h = 0x1234_5678_9abc_def0
	c := &Cache[decision]{}
	d := decision{Action: resource.Deny, Policy: "deny-db"}
	epoch := &Epoch[decision]{}
	key := func(mesh, typ string, f *index.Flow) *Key[decision] {
		return &Key[decision]{H: h, Epoch: epoch, Mesh: mesh, Type: typ, Flow: *f}
	}
	c.Store(key("m", "T", &base), &d) // first sight: the doorkeeper only
	if _, ok := c.Lookup(key("m", "T", &base)); ok {
		t.Fatal("a flow seen once is cached")
	}
	c.Store(key("m", "T", &base), &d)
	if got, ok := c.Lookup(key("m", "T", &base)); !ok || got.Answer().Policy != "deny-db" {
		t.Fatalf("a flow seen twice is not cached: %+v %v", got, ok)
	}
	if _, ok := c.Lookup(&Key[decision]{H: h, Epoch: &Epoch[decision]{}, Mesh: "m", Type: "T", Flow: base}); ok {
		t.Error("an entry of another epoch answered")
	}
	src, dst := inventory.NewTagSet(1, base.Src), inventory.NewTagSet(2, base.Dst)
	if _, ok := c.Lookup(&Key[decision]{H: h, Epoch: epoch, Mesh: "m", Type: "T", Flow: base, Src: src, Dst: dst}); !ok {
		t.Error("a lookup with interned sets missed an entry stored with tags")
	}
	others := map[string]struct {
		mesh, typ string
		f         index.Flow
	}{
		"mesh":            {"other", "T", base},
		"type":            {"m", "U", base},
		"protocol":        {"m", "T", index.Flow{Src: base.Src, Dst: base.Dst, Proto: resource.UDP, Port: 5432}},
		"port":            {"m", "T", index.Flow{Src: base.Src, Dst: base.Dst, Proto: resource.TCP, Port: 5433}},
		"source value":    {"m", "T", index.Flow{Src: resource.Tags{"app": "api"}, Dst: base.Dst, Proto: resource.TCP, Port: 5432}},
		"source extra":    {"m", "T", index.Flow{Src: resource.Tags{"app": "web", "v": "1"}, Dst: base.Dst, Proto: resource.TCP, Port: 5432}},
		"destination key": {"m", "T", index.Flow{Src: base.Src, Dst: resource.Tags{"app": "db", "zone": "prod"}, Proto: resource.TCP, Port: 5432}},
		"destination one": {"m", "T", index.Flow{Src: base.Src, Dst: resource.Tags{"app": "db"}, Proto: resource.TCP, Port: 5432}},
	}
	for name, o := range others {
		if got, ok := c.Lookup(key(o.mesh, o.typ, &o.f)); ok {
			t.Errorf("%s differs but the cache answered %+v", name, got)
		}
	}
}

// cycleHitRate decides n distinct flows round after round through the cache
// (as Decide does: lookup, else store) and returns the share of hits in the
// last rounds.
func cycleHitRate(n, rounds int) float64 {
	c := &Cache[decision]{}
	epoch := &Epoch[decision]{}
	flows := make([]index.Flow, n)
	for i := range flows {
		flows[i] = index.Flow{Src: resource.Tags{"app": "web", "i": itoa(i)}, Dst: resource.Tags{"app": "db"}, Proto: resource.TCP, Port: 5432}
	}
	hits, asked := 0, 0
	for r := 0; r < rounds; r++ {
		for i := range flows {
			k := &Key[decision]{H: FlowHash("m", "T", &flows[i]), Epoch: epoch, Mesh: "m", Type: "T", Flow: flows[i]}
			_, ok := c.Lookup(k)
			if !ok {
				c.Store(k, &decision{Action: resource.Allow})
			}
			if r >= rounds-3 {
				asked++
				if ok {
					hits++
				}
			}
		}
	}
	return float64(hits) / float64(asked)
}

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

// TestCacheHitRateOnCycles: flows cycling over a set smaller than the cache all
// stay cached (the old direct-mapped cache re-decided 7% of 10k every round);
// over sets larger than the cache, the resident flows keep hitting instead of
// every flow evicting another.
func TestCacheHitRateOnCycles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flows int
		min   float64
	}{
		{4_096, 0.999},
		{10_000, 0.99},
		{cacheSlots * 5 / 4, 0.6},
		{cacheSlots * 2, 0.4},
		{cacheSlots * 4, 0.2},
	} {
		if testing.Short() && tc.flows > cacheSlots*2 {
			continue
		}
		got := cycleHitRate(tc.flows, 6)
		t.Logf("cycling %d flows through %d entries: %.2f%% hits", tc.flows, cacheSlots, 100*got)
		if got < tc.min {
			t.Errorf("cycling %d flows: hit rate %.4f, want ≥ %.3f", tc.flows, got, tc.min)
		}
	}
}

// TestCacheKeyedByEpoch: flows asked at revisions in turn — each flow at
// many epochs, interleaved, as callers of the past ask — keep hitting in a
// memo keyed by epoch; a lineage's memo, where each epoch's answer replaces
// the last one in place, misses almost every time, and is right to (its
// epochs follow each other). Both answer each epoch with its own answer.
func TestCacheKeyedByEpoch(t *testing.T) {
	t.Parallel()
	const nFlows, nEpochs = 64, 1000 // 8,000 distinct (epoch, flow) pairs asked in a cycle
	flows := make([]index.Flow, nFlows)
	for i := range flows {
		flows[i] = index.Flow{Src: resource.Tags{"app": "web", "i": itoa(i)}, Dst: resource.Tags{"app": "db"}, Proto: resource.TCP, Port: 5432}
	}
	epochs := make([]*Epoch[decision], nEpochs)
	for i := range epochs {
		epochs[i] = &Epoch[decision]{}
	}
	for _, tc := range []struct {
		name     string
		byEpoch  bool
		min, max float64 // the hit rate over the last cycle
	}{
		{"keyed by epoch", true, 0.99, 1},
		{"a lineage's memo", false, 0, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Holder[decision]
			if tc.byEpoch {
				h.KeyByEpoch(func(a, b *decision) bool { return *a == *b })
			}
			c := h.Get()
			const cycle = nFlows * nEpochs / 8 // lcm(64, 1000)
			hits := 0
			for i := range 4 * cycle {
				f, e := i%nFlows, i%nEpochs
				k := &Key[decision]{H: FlowHash("m", "T", &flows[f]), Epoch: epochs[e], Mesh: "m", Type: "T", Flow: flows[f]}
				want := decision{Action: resource.Allow, Policy: itoa(e)}
				got, ok := c.Lookup(k)
				if !ok {
					c.Store(k, &want)
				} else if *got.Answer() != want {
					t.Fatalf("flow %d at epoch %d: answered %+v, the answer of another epoch", f, e, *got.Answer())
				}
				if i >= 3*cycle && ok {
					hits++
				}
			}
			rate := float64(hits) / cycle
			t.Logf("%s: %.2f%% hits", tc.name, 100*rate)
			if rate < tc.min || rate > tc.max {
				t.Errorf("hit rate %.4f, want %.2f–%.2f", rate, tc.min, tc.max)
			}
		})
	}
}

// TestEntriesOfEpochsShareEqualAnswers: in a memo keyed by epoch, a flow's
// entries of several epochs share one answer where the answers are equal and
// keep their own where they differ; each entry answers only its own epoch, and
// another flow never lends its answer.
func TestEntriesOfEpochsShareEqualAnswers(t *testing.T) {
	t.Parallel()
	var h Holder[decision]
	h.KeyByEpoch(func(a, b *decision) bool { return *a == *b })
	c := h.Get()
	flow := index.Flow{Src: resource.Tags{"app": "web"}, Dst: resource.Tags{"app": "db"}, Proto: resource.TCP, Port: 5432}
	other := index.Flow{Src: resource.Tags{"app": "api"}, Dst: resource.Tags{"app": "db"}, Proto: resource.TCP, Port: 5432}
	allow, deny := decision{Action: resource.Allow, Policy: "p"}, decision{Action: resource.Deny, Policy: "q"}
	epochs := []*Epoch[decision]{{}, {}, {}, {}}
	cases := []struct {
		epoch  *Epoch[decision]
		f      index.Flow
		d      decision
		shares int // the case whose answer this one's is (-1: its own)
	}{
		{epochs[0], flow, allow, -1},
		{epochs[1], flow, allow, 0},
		{epochs[2], flow, deny, -1},
		{epochs[3], flow, deny, 2},
		{epochs[3], other, deny, -1}, // same hash home as flow (H below): another flow's answer is not lent
	}
	key := func(i int) *Key[decision] {
		return &Key[decision]{H: 0x1234_5678_9abc_def0, Epoch: cases[i].epoch, Mesh: "m", Type: "T", Flow: cases[i].f}
	}
	answers := make([]*decision, len(cases))
	for i, tc := range cases {
		c.Store(key(i), &tc.d) // first sight: the doorkeeper only
		e := c.Store(key(i), &tc.d)
		if e == nil {
			t.Fatalf("case %d: a flow seen twice is not stored", i)
		}
		answers[i] = e.Answer()
		if tc.shares >= 0 && answers[i] != answers[tc.shares] {
			t.Errorf("case %d: an answer equal to case %d's is not shared", i, tc.shares)
		}
		for j := range i {
			if tc.shares != j && answers[i] == answers[j] {
				t.Errorf("case %d: shares case %d's answer", i, j)
			}
		}
	}
	for i, tc := range cases {
		e, ok := c.Lookup(key(i))
		if !ok || *e.Answer() != tc.d {
			t.Errorf("case %d: the memo answers %v, %v: want %v", i, e, ok, tc.d)
		}
	}
}

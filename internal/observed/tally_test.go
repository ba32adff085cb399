package observed

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// counter counts as the pair memo's entries do (Seen, Take).
type counter struct{ n atomic.Uint32 }

func (c *counter) seen() bool   { return c.n.Add(1) == 1 }
func (c *counter) Take() uint32 { return c.n.Swap(0) }

// TestTalliesAddUpUnderTakes counts flows in their own counters from several
// workers, registering each on its first count since a take, while reads
// take them: every decision is in the table, each flow once, with its answer.
func TestTalliesAddUpUnderTakes(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	var sets []*inventory.TagSet
	for i := range 40 {
		s, err := reg.Register("m", resource.Tags{"app": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, s)
	}
	type flow struct {
		c        counter
		src, dst *inventory.TagSet
	}
	flows := make([]flow, 0, len(sets)*4)
	for _, s := range sets {
		for _, d := range sets[:4] {
			flows = append(flows, flow{src: s, dst: d})
		}
	}
	policies := []string{"allow-all", "deny-db"}
	tab := New(Config{})
	const workers, rounds = 4, 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var fs []TallyFlow
			for r := range rounds {
				fs = fs[:0]
				for i := range flows {
					f := &flows[(i+w*7)%len(flows)]
					if f.c.seen() {
						fs = append(fs, TallyFlow{C: &f.c, Src: f.src, Dst: f.dst, PP: packPort(resource.TCP, 5432), Policy: 1, Deny: true})
					}
				}
				b := tab.Batch("m", "", uint64(w+r))
				b.TallyN(fs, policies, 9)
				b.Done()
			}
		})
	}
	wg.Go(func() {
		for range 30 {
			tab.Flows(nil)
		}
	})
	wg.Wait()
	got := tab.Flows(nil)
	if len(got) != len(flows) {
		t.Fatalf("%d flows, want %d", len(got), len(flows))
	}
	for _, f := range got {
		if f.Count != workers*rounds || f.Policy != "deny-db" || f.Action != resource.Deny || f.Revision != 9 || f.Port != 5432 {
			t.Fatalf("flow %+v: want %d decisions, DENY by deny-db at 9", f, workers*rounds)
		}
	}
}

// TestTalliesAreBounded registers more entries than a stripe holds between
// takes: the batch takes its stripe's list into the table first, and no
// count is lost.
func TestTalliesAreBounded(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	src, _ := reg.Register("m", resource.Tags{"app": "src"})
	dst, _ := reg.Register("m", resource.Tags{"app": "dst"})
	tab := New(Config{})
	const n = maxTallied + 100
	cs := make([]counter, n)
	fs := make([]TallyFlow, n)
	for i := range fs {
		cs[i].seen()
		fs[i] = TallyFlow{C: &cs[i], Src: src, Dst: dst, PP: packPort(resource.TCP, uint32(i%60000))}
	}
	b := tab.Batch("m", "", 0)
	b.TallyN(fs, []string{""}, 1)
	if len(b.s.tallied) > maxTallied {
		t.Fatalf("stripe holds %d entries, over %d", len(b.s.tallied), maxTallied)
	}
	b.Done()
	var total uint64
	for _, f := range tab.Flows(nil) {
		total += f.Count
	}
	if total != n {
		t.Fatalf("%d decisions counted, want %d", total, n)
	}
}

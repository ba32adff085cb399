//go:build linux

package engine_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// manyRules is a mesh with one policy of n rule names in its defaults (type
// Cfg, the fold) and one of n names in the conf of a from item (type Tr,
// the merge of items).
func manyRules(tb testing.TB, n int) *engine.Snapshot {
	tb.Helper()
	var rules strings.Builder
	for i := range n {
		if i > 0 {
			rules.WriteString(", ")
		}
		fmt.Fprintf(&rules, "k%06d: %d", i, i)
	}
	docs := fmt.Sprintf(`
{kind: Policy, mesh: m, name: big, type: Cfg, targetRef: {kind: Mesh}, defaults: {rules: {%[1]s}}}
---
{kind: Policy, mesh: m, name: items, type: Tr, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, conf: {%[1]s}}]}
`, rules.String())
	rs, err := resource.DecodeYAML([]byte(docs))
	if err != nil {
		tb.Fatal(err)
	}
	return engine.Build(1, rs)
}

// TestResolveLinearInRules: Resolve's cost grows with the number of rule
// names as the names do, not as their square (issue 12 F7: the names were
// deduplicated by a linear scan each, 40k names took 7.9 s). It compares the
// CPU time (of the thread that runs Resolve: the machine's load does not
// count) of 2.5k and 40k names in the same run: 16 times the names may cost up
// to 160 times as much (linear, with sorting and maps that outgrow the caches:
// about 60 here; the quadratic scan: over 300).
// The small cost is the best of five runs, and the large one passes as soon
// as one of up to three runs is within the factor, so a busy machine can only
// make the test more lenient. No absolute time is asserted.
func TestResolveLinearInRules(t *testing.T) { // not parallel: it compares costs
	const small, large, factor = 2_500, 40_000, 160
	snaps := map[int]*engine.Snapshot{small: manyRules(t, small), large: manyRules(t, large)}
	cost := func(n int, typ string) time.Duration {
		t.Helper()
		runtime.GC()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := threadCPU(t)
		res, err := snaps[n].Resolve(&engine.ResolveRequest{Mesh: "m", Type: typ, Source: resource.Tags{"app": "b"},
			Destination: resource.Tags{"app": "a"}})
		took := threadCPU(t) - start
		if err != nil {
			t.Fatal(err)
		}
		if got := len(res.Main.Rules); got != n {
			t.Fatalf("%s with %d names: %d rules resolved", typ, n, got)
		}
		return took
	}
	for _, typ := range []string{"Cfg", "Tr"} { // the fold; the merge of items
		base := cost(small, typ)
		for range 4 {
			base = min(base, cost(small, typ))
		}
		var ratio float64
		for range 3 {
			if ratio = float64(cost(large, typ)) / float64(base); ratio <= factor {
				break
			}
		}
		t.Logf("%s: %d names cost %.1f times %d names", typ, large, ratio, small)
		if ratio > factor {
			t.Errorf("%s: %d rule names cost %.0f times %d names: superlinear", typ, large, ratio, small)
		}
	}
}

// threadCPU is the CPU time the calling OS thread has used
// (CLOCK_THREAD_CPUTIME_ID).
func threadCPU(t *testing.T) time.Duration {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

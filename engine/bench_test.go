package engine_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The engine's figures (README, "Engine performance"): make bench, or
//   go test -run '^$' -bench . -benchmem ./engine/

var benchSizes = []int{1_000, 10_000, 100_000}

// sizes returns the benchmarked set sizes: 100k only without -short (make bench
// runs it; building the 100k sets takes seconds each).
func sizes(tb testing.TB) []int {
	if testing.Short() {
		return benchSizes[:2]
	}
	return benchSizes
}

func benchSet(n int, scopes int) *policygen.Set {
	return policygen.Generate(policygen.Config{Seed: 1, Policies: n, Scopes: scopes})
}

var profiles = []struct {
	name    string
	profile policygen.Profile
}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}}

// BenchmarkDecide: on both profiles (policygen), both combining algorithms and
// every size, over 4096 generated flows: "nocache" is the decision procedure
// itself (Request.NoCache); "cached" the same flows with the snapshot's
// decision cache, where they repeat; "quick-index" is policygen.QuickIndex, the
// honest baseline (posting lists per tag, verify, best rank), on the same flows
// in the same run. Sparse sets also run with 50 scopes. Two variants of issue
// 19's targets run on both profiles under FirstMatch: "perdest" (the type's
// select is Kuma's PerDestination) and "audit=10" (10% of the policies in mode
// Audit, so every decision also computes the shadow decision); the quick index
// has neither, so they run without it.
func BenchmarkDecide(b *testing.B) {
	for _, pr := range profiles {
		for _, combine := range []resource.Combine{resource.FirstMatch, resource.DenyOverrides} {
			for _, n := range sizes(b) {
				scopeCounts := []int{0}
				if pr.profile == policygen.Sparse && combine == resource.FirstMatch {
					scopeCounts = []int{0, 50}
				}
				for _, scopes := range scopeCounts {
					benchDecide(b, fmt.Sprintf("%s/%s/policies=%d/scopes=%d", pr.name, combine, n, scopes),
						policygen.Config{Seed: 1, Policies: n, Scopes: scopes, Combine: combine, Profile: pr.profile})
				}
			}
		}
		for _, n := range sizes(b) {
			benchDecide(b, fmt.Sprintf("%s/FirstMatch-perdest/policies=%d/scopes=0", pr.name, n),
				policygen.Config{Seed: 1, Policies: n, Profile: pr.profile, Select: resource.SelectPerDestination})
			benchDecide(b, fmt.Sprintf("%s/FirstMatch-audit=10/policies=%d/scopes=0", pr.name, n),
				policygen.Config{Seed: 1, Policies: n, Profile: pr.profile, AuditPercent: 10})
		}
	}
}

func benchDecide(b *testing.B, name string, cfg policygen.Config) {
	// The set, its snapshot and flows are made when a sub-benchmark first
	// runs: a pattern that selects a few builds only their sets.
	var (
		set           *policygen.Set
		snap          *engine.Snapshot
		flows, cached []engine.Request
	)
	setup := func() {
		if set != nil {
			return
		}
		set = policygen.Generate(cfg)
		snap = engine.Build(1, set.Resources)
		flows = set.Flows(2, 4096)
		cached = append([]engine.Request(nil), flows...)
		for i := range flows {
			flows[i].NoCache = true
		}
	}
	b.Run(name+"/nocache", func(b *testing.B) {
		setup()
		b.ReportAllocs()
		matched := 0
		cpu := processCPU(b)
		for i := 0; b.Loop(); i++ {
			d, err := snap.Decide(&flows[i&4095])
			if err != nil {
				b.Fatal(err)
			}
			if d.Inbound.Reason == engine.ReasonMatched {
				matched++
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(matched)/float64(b.N), "matched/op")
	})
	b.Run(name+"/cached", func(b *testing.B) {
		setup()
		for i := 0; i < 3*len(cached); i++ { // seen, stored, hit: warm
			_, _ = snap.Decide(&cached[i&4095])
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := snap.Decide(&cached[i&4095]); err != nil {
				b.Fatal(err)
			}
		}
	})
	if cfg.Scopes > 0 || cfg.Select != resource.SelectUnset || cfg.AuditPercent > 0 {
		return // the quick index covers unscoped sets, default select, no audit
	}
	var q *policygen.QuickIndex
	matching := 0
	setupQuick := func() {
		if q != nil {
			return
		}
		setup()
		var err error
		if q, err = policygen.NewQuickIndex(set); err != nil {
			b.Fatal(err)
		}
		// How dense the set is: the policies a flow matches, on average over
		// the first 128 flows (a linear scan of the quick index's rules).
		for i := range 128 {
			matching += q.Matching(&flows[i])
		}
	}
	b.Run(name+"/quick-index", func(b *testing.B) {
		setupQuick()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			q.Decide(&flows[i&4095])
		}
	})
	// The ratio, robust on a busy machine: verdict (NoCache) and the quick index
	// decide the same batch of 256 flows in turn, each timed, so both see the
	// same load; "quick/verdict" is the quick index's time over verdict's, by
	// the wall clock and by the CPU time the process used ("-cpu": what a
	// decision costs, whatever else the machine runs).
	b.Run(name+"/vs-quick", func(b *testing.B) {
		setupQuick()
		var tv, tq, cv, cq time.Duration
		for i := 0; b.Loop(); i++ {
			batch := flows[(i*256)&4095 : (i*256)&4095+256]
			start, cstart := time.Now(), processCPU(b)
			for j := range batch {
				if _, err := snap.Decide(&batch[j]); err != nil {
					b.Fatal(err)
				}
			}
			mid, cmid := time.Now(), processCPU(b)
			for j := range batch {
				q.Decide(&batch[j])
			}
			tv, tq = tv+mid.Sub(start), tq+time.Since(mid)
			cv, cq = cv+cmid-cstart, cq+processCPU(b)-cmid
		}
		n := float64(b.N * 256)
		b.ReportMetric(float64(tv.Nanoseconds())/n, "verdict-ns/decision")
		b.ReportMetric(float64(tq.Nanoseconds())/n, "quick-ns/decision")
		b.ReportMetric(float64(tq)/float64(tv), "quick/verdict")
		b.ReportMetric(float64(cv.Nanoseconds())/n, "verdict-cpu-ns/decision")
		b.ReportMetric(float64(cq.Nanoseconds())/n, "quick-cpu-ns/decision")
		b.ReportMetric(float64(cq)/float64(cv), "quick/verdict-cpu")
		b.ReportMetric(float64(matching)/128, "matching-policies/flow")
	})
}

// processCPU is the CPU time the process has used (CLOCK_PROCESS_CPUTIME_ID):
// a decision allocates nothing, so between two readings it is the
// benchmark's own.
func processCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		set := benchSet(n, 50)
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				engine.Build(1, set.Resources)
			}
		})
	}
}

// BenchmarkApplyOne changes one policy of a 10k- and a 100k-policy snapshot,
// in the hard case: one mesh, one type; an ALLOW policy and a DENY one (under
// FirstMatch their rules share one order, and a class's structures differ in
// size). It alternates two versions of the policy so every iteration is a
// real update (remove the old rules, file the new ones).
func BenchmarkApplyOne(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		set := benchSet(n, 50)
		snap := engine.Build(1, set.Resources)
		for _, action := range []resource.Action{resource.Allow, resource.Deny} {
			var base *resource.Policy
			for _, p := range set.Policies()[n/2:] {
				if p.Action == action {
					base = p
					break
				}
			}
			alt := *base
			alt.Priority = base.Priority + 1
			alt.Destinations = []resource.Selector{{Match: map[string]string{resource.ServiceTag: "svc-moved"}}}
			versions := []resource.Resource{&alt, base}
			b.Run(fmt.Sprintf("policies=%d/action=%s", n, action), func(b *testing.B) {
				b.ReportAllocs()
				rev := int64(1)
				cpu := processCPU(b)
				for i := 0; b.Loop(); i++ {
					rev++
					snap = snap.Apply(rev, []engine.Change{engine.Put(versions[i%2])})
				}
				// The garbage collector's work included: a change allocates.
				b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkMemory reports the heap a 100k-policy snapshot holds per policy,
// indexes included (the decoded resources are counted too: the snapshot keeps them).
func BenchmarkMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		set := benchSet(n, 50)
		snap := engine.Build(1, set.Resources)
		set = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/policy")
		runtime.KeepAlive(snap)
	}
}

// BenchmarkDecideIdentityPair (issue 13 items 3-4): a flow between interned
// tag sets (identities resolved once, as the compact path resolves them),
// with the memo ("memo": flows repeat, a hit is a hash and two pointer
// compares) and without ("nomemo": the decision procedure itself), beside the
// tag form with the memo on the same flows ("tags-memo": the hash walks both
// tag maps). 10k sparse policies, 4096 flows.
//
//	go test -run '^$' -bench BenchmarkDecideIdentityPair -benchmem ./engine/
func BenchmarkDecideIdentityPair(b *testing.B) {
	set := policygen.Generate(policygen.Config{Seed: 1, Policies: 10_000})
	snap := engine.Build(1, set.Resources)
	flows := set.Flows(2, 4096)
	reg := inventory.NewRegistry(0, 0)
	reqs := make([]engine.SetRequest, len(flows))
	for i, f := range flows {
		src, err := snap.Identify("", f.Source, reg)
		if err != nil {
			b.Fatal(err)
		}
		dst, err := snap.Identify("", f.Destination, reg)
		if err != nil {
			b.Fatal(err)
		}
		reqs[i] = engine.SetRequest{Source: src, Destination: dst, Protocol: f.Protocol, Port: f.Port}
		flows[i].Source, flows[i].Destination = src.Tags(), dst.Tags()
	}
	for _, memo := range []bool{true, false} {
		name := "memo"
		if !memo {
			name = "nomemo"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r := &reqs[i&4095]
				r.NoCache = !memo
				if _, err := snap.DecideSets(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("tags-memo", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := snap.Decide(&flows[i&4095]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lookup", func(b *testing.B) { // identity → interned set, inventory then registry
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := snap.LookupIdentity("", reqs[i&4095].Source.Identity(), reg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchWorkloads is n workloads of the default mesh in the shape of a Kuma
// deployment: 1,000 services in three environments and three versions (about
// 9,000 distinct tag sets, so identities are shared), one IPv4 address each, a
// SPIFFE principal per service.
// benchWorkloads gives workloads with one tag set one map, as the store's full
// list decodes them (store.TagInterner): the engine copies a workload whose
// map is not its tag set's to share it, and "heap" would count those copies
// while the originals stay held here.
func benchWorkloads(n int) []resource.Resource {
	envs, versions := []string{"prod", "staging", "dev"}, []string{"v1", "v2", "v3"}
	out := make([]resource.Resource, n)
	sets := map[string]map[string]string{}
	for i := range n {
		svc := fmt.Sprintf("svc-%03d", i%1000)
		env, version := envs[(i/1000)%3], versions[(i/3000)%3]
		set := svc + "/" + env + "/" + version
		if sets[set] == nil {
			sets[set] = map[string]string{resource.ServiceTag: svc, "env": env, "version": version, "kuma.io/zone": "zone-a"}
		}
		out[i] = &resource.Workload{Mesh: resource.DefaultMesh, Name: fmt.Sprintf("%s-%d", svc, i),
			Tags:      sets[set],
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)},
			Principal: "spiffe://default/" + svc,
			Meta:      resource.Meta{CreateRevision: 1, ModRevision: 1}}
	}
	return out
}

// BenchmarkWorkloads (issue 13 item 6): a snapshot of 10k policies and 100k
// workloads. "build" is the engine's share of a cold start (every resource
// decoded already, as the store's list hands them over); "heap" the heap the
// workloads add to the policies' snapshot, per workload; "put" one workload
// changing its tags in the 100k inventory (a new snapshot, as the syncer makes
// for a workload put).
//
//	go test -run '^$' -bench BenchmarkWorkloads -benchmem ./engine/
func BenchmarkWorkloads(b *testing.B) {
	const nw = 100_000
	set := benchSet(10_000, 50)
	wls := benchWorkloads(nw)
	all := append(append([]resource.Resource(nil), set.Resources...), wls...)
	b.Run("build", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			engine.Build(1, all)
		}
	})
	b.Run("heap", func(b *testing.B) {
		for b.Loop() {
			runtime.GC()
			var before, after runtime.MemStats
			policies := engine.Build(1, set.Resources)
			runtime.GC()
			runtime.ReadMemStats(&before)
			snap := policies.Apply(2, puts(wls))
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/nw, "B/workload")
			runtime.KeepAlive(snap)
			runtime.KeepAlive(policies)
		}
	})
	b.Run("put", func(b *testing.B) {
		snap := engine.Build(1, all)
		w := *wls[nw/2].(*resource.Workload)
		alt := w
		alt.Tags = map[string]string{resource.ServiceTag: "svc-moved", "env": "prod", "version": "v9", "kuma.io/zone": "zone-a"}
		versions := []resource.Resource{&alt, &w}
		b.ReportAllocs()
		rev := int64(1)
		for i := 0; b.Loop(); i++ {
			rev++
			snap = snap.Apply(rev, []engine.Change{engine.Put(versions[i%2])})
		}
		if snap.Invalid() != nil {
			b.Fatalf("invalid resources: %v", snap.Invalid()[0].Err)
		}
	})
}

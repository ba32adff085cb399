package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/loadtest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/embedetcd"
)

// ColdStartResult is what the cold-start subcommand measures (issue 13 item 6):
// verdictd started again on an embedded etcd that already holds Workloads and
// Policies, from process start to SERVING and to deciding at the seeded
// revision, and its memory afterwards.
type ColdStartResult struct {
	Workloads int           `json:"workloads"`
	Policies  int           `json:"policies"`
	Keys      int           `json:"keys"`     // resources seeded (meshes and scopes too)
	Revision  int64         `json:"revision"` // the seeded store's revision
	SeedTime  time.Duration `json:"seedTime"`
	Starts    []ColdStart   `json:"starts"`
	// Empty is the memory of the first verdictd before seeding: the
	// process's own cost, which the per-workload figures do not subtract.
	Empty Memory `json:"empty"`
}

// ColdStart is one restart on the seeded data.
type ColdStart struct {
	// ToServing: process start → gRPC health SERVING; ToReady: → a Decide
	// with min_revision = the seeded revision answered (the data is served).
	ToServing time.Duration `json:"toServing"`
	ToReady   time.Duration `json:"toReady"`
	Memory    Memory        `json:"memory"`
	// HeapPerWorkload and RSSPerWorkload divide the whole process's live heap
	// and resident set by the workloads (policies included: an upper bound).
	HeapPerWorkload float64 `json:"heapPerWorkload"`
	RSSPerWorkload  float64 `json:"rssPerWorkload"`
	// HeapOverEmptyPerWorkload subtracts the empty verdictd's live heap first.
	HeapOverEmptyPerWorkload float64 `json:"heapOverEmptyPerWorkload"`
	// AfterGC is the memory read again after a forced GC (verdictd's
	// /debug/pprof/heap?gc=1): Memory's live heap is the last GC's, which
	// may have run during the build, with its garbage still live.
	// LivePerWorkload divides AfterGC's live heap by the workloads.
	AfterGC         Memory  `json:"afterGC"`
	LivePerWorkload float64 `json:"livePerWorkload"`
	// Checked probes answered as before the restart.
	Checked int `json:"checked"`
}

// Memory is read from verdictd's /metrics.
type Memory struct {
	HeapLive  float64 `json:"heapLiveBytes"`  // go_gc_heap_live_bytes: marked live by the last GC
	HeapInuse float64 `json:"heapInuseBytes"` // go_memstats_heap_inuse_bytes
	RSS       float64 `json:"rssBytes"`       // process_resident_memory_bytes
}

// coldStart is the cold-start subcommand: it seeds verdictd's embedded etcd
// with --workloads workloads (the workload-churn inventory) and --policies
// generated policies through Apply, stops verdictd, starts it --restarts
// times on the same data directory and measures each start. Bounded by
// --timeout; the data directory goes at the end.
func coldStart(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cold-start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("verdictd", defaultVerdictd(), "the verdictd binary to start")
	workloads := fs.Int("workloads", 100000, "workloads to seed (≤ 1000000)")
	policies := fs.Int("policies", 10000, "generated policies to seed (engine/policygen)")
	seed := fs.Uint64("seed", 1, "generator seed")
	restarts := fs.Int("restarts", 3, "starts measured on the seeded data (≤ 10)")
	tmp := fs.String("etcd-tmpdir", "", "directory for the etcd data (default: the system's temporary directory)")
	timeout := fs.Duration("timeout", 15*time.Minute, "bound on the whole run")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	external := fs.Bool("external-etcd", false, "run etcd in this process (embedded, loopback) and start verdictd with --etcd-endpoints: "+
		"verdictd's heap then excludes etcd's own memory")
	pprofDir := fs.String("profile-dir", "", "write each start's CPU profile (its first --profile-seconds from the metrics listener's start) and "+
		"heap profile (/debug/pprof/heap?gc=1, once deciding) into this directory")
	pprofSeconds := fs.Int("profile-seconds", 5, "length of each start's CPU profile with --profile-dir")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *bin == "" || *workloads < 2 || *workloads > 1_000_000 || *policies < 0 || *restarts < 1 || *restarts > 10 ||
		*timeout <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "cold-start: --verdictd is required, --workloads in [2, 1000000], --restarts in [1, 10], --timeout positive, no arguments")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	opts := coldStartOptions{external: *external, pprofDir: *pprofDir, pprofSeconds: *pprofSeconds}
	res, err := measureColdStart(ctx, *bin, *tmp, *workloads, *policies, *seed, *restarts, opts, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "verdict-loadtest cold-start:", err)
		return 3
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return 3
		}
		return 0
	}
	writeColdStart(stdout, res)
	return 0
}

// coldStartOptions are cold-start's optional measurements.
type coldStartOptions struct {
	external     bool   // etcd in this process, verdictd with --etcd-endpoints
	pprofDir     string // profiles of each start go here
	pprofSeconds int
}

func measureColdStart(ctx context.Context, bin, tmp string, workloads, policies int, seed uint64, restarts int,
	opts coldStartOptions, stderr io.Writer) (*ColdStartResult, error) {
	dir, err := os.MkdirTemp(tmp, "verdict-cold-start")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	store := []string{"--data-dir", dir + "/etcd"}
	if opts.external {
		e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir + "/external-etcd", ProgressNotifyInterval: 5 * time.Second})
		if err != nil {
			return nil, fmt.Errorf("external etcd: %w", err)
		}
		defer func() { _ = e.Close() }() // the measured daemon's own exit is what counts
		store = []string{"--etcd-endpoints", strings.Join(e.Endpoints(), ",")}
	}
	start := func() (*process, string, time.Time, error) {
		t0 := time.Now()
		// Free ports picked per attempt: a start that loses its port to
		// another process is tried again on new ones.
		args := append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"}, store...)
		p, err := startProcess(ctx, bin, "", stderr, args...)
		if err != nil {
			return nil, "", t0, err
		}
		return p, p.metrics, t0, nil
	}

	// Seed through the first verdictd.
	p, metrics, _, err := start()
	if err != nil {
		return nil, fmt.Errorf("start verdictd: %w", err)
	}
	defer func() {
		if p != nil {
			p.stop()
		}
	}()
	conns, err := dial(p.addr, 1)
	if err != nil {
		return nil, err
	}
	if err := waitServing(ctx, conns[0]); err != nil {
		closeAll(conns)
		return nil, err
	}
	res := &ColdStartResult{Workloads: workloads, Policies: policies}
	if res.Empty, err = readMemory(ctx, metrics); err != nil {
		closeAll(conns)
		return nil, err
	}
	set := policygen.Generate(policygen.Config{Seed: seed, Policies: policies})
	wls, probes := loadtest.ChurnWorkloads(set.Flows(seed+4, 4096), workloads)
	all := append([]resource.Resource(nil), set.Resources...)
	for _, w := range wls {
		all = append(all, w)
	}
	res.Keys = len(all)
	t := time.Now()
	if res.Revision, err = load(ctx, conns[0], all); err != nil {
		closeAll(conns)
		return nil, fmt.Errorf("seed %d resources: %w", len(all), err)
	}
	if len(probes) > 64 {
		probes = probes[:64]
	}
	expected, err := answers(ctx, conns[0], probes, res.Revision)
	res.SeedTime = time.Since(t)
	closeAll(conns)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "seeded %d resources (%d workloads, %d policies) in %v, revision %d\n", res.Keys, workloads,
		policies, res.SeedTime.Round(time.Millisecond), res.Revision)
	p.stop()

	for i := 0; i < restarts; i++ {
		var t0 time.Time
		p, metrics, t0, err = start()
		if err != nil {
			return nil, fmt.Errorf("restart verdictd: %w", err)
		}
		var cpu chan error
		if opts.pprofDir != "" {
			cpu = make(chan error, 1)
			go func() {
				cpu <- saveProfile(ctx, metrics, fmt.Sprintf("/debug/pprof/profile?seconds=%d", opts.pprofSeconds),
					fmt.Sprintf("%s/cpu-start%d.pb.gz", opts.pprofDir, i+1))
			}()
		}
		cs, err := measureStart(ctx, p.addr, metrics, t0, res.Revision, probes, expected)
		if err == nil && cpu != nil {
			if err = <-cpu; err == nil {
				err = saveProfile(ctx, metrics, "/debug/pprof/heap?gc=1", fmt.Sprintf("%s/heap-start%d.pb.gz", opts.pprofDir, i+1))
			}
		}
		p.stop()
		if err != nil {
			return nil, fmt.Errorf("start %d: %w", i+1, err)
		}
		cs.HeapPerWorkload = cs.Memory.HeapLive / float64(workloads)
		cs.RSSPerWorkload = cs.Memory.RSS / float64(workloads)
		cs.HeapOverEmptyPerWorkload = (cs.Memory.HeapLive - res.Empty.HeapLive) / float64(workloads)
		cs.LivePerWorkload = cs.AfterGC.HeapLive / float64(workloads)
		res.Starts = append(res.Starts, cs)
	}
	return res, nil
}

// measureStart waits for the started verdictd to be SERVING and then to answer
// at rev, checks the probes' answers and reads its memory.
func measureStart(ctx context.Context, addr, metrics string, t0 time.Time, rev int64,
	probes []*verdictv1.DecideRequest, expected []*verdictv1.DecideResponse) (ColdStart, error) {
	var cs ColdStart
	conns, err := dial(addr, 1)
	if err != nil {
		return cs, err
	}
	defer closeAll(conns)
	if err := waitServing(ctx, conns[0]); err != nil {
		return cs, err
	}
	cs.ToServing = time.Since(t0)
	client := verdictv1.NewDecisionServiceClient(conns[0])
	q := proto.Clone(probes[0]).(*verdictv1.DecideRequest)
	q.MinRevision = rev
	deadline := time.Now().Add(5 * time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := client.Decide(cctx, q)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return cs, fmt.Errorf("not deciding at revision %d: %w", rev, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	cs.ToReady = time.Since(t0)
	got, err := answers(ctx, conns[0], probes, rev)
	if err != nil {
		return cs, err
	}
	for i := range got {
		if answerKey(got[i]) != answerKey(expected[i]) {
			return cs, fmt.Errorf("probe %d answers %v after the restart, %v before", i, answerKey(got[i]), answerKey(expected[i]))
		}
	}
	cs.Checked = len(got)
	if cs.Memory, err = readMemory(ctx, metrics); err != nil {
		return cs, err
	}
	if err := saveProfile(ctx, metrics, "/debug/pprof/heap?gc=1", os.DevNull); err != nil {
		return cs, err
	}
	cs.AfterGC, err = readMemory(ctx, metrics)
	return cs, err
}

// saveProfile writes the profile at http://metrics+path into file, trying
// again while the metrics listener is not up yet (the process is starting).
func saveProfile(ctx context.Context, metrics, path, file string) error {
	for {
		err := fetchProfile(ctx, "http://"+metrics+path, file, 2*time.Minute)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// answerKey is what a probe must answer alike before and after a restart.
func answerKey(r *verdictv1.DecideResponse) string {
	return fmt.Sprintf("%v %s %s→%s", r.GetAction(), r.GetPolicy(), r.GetSourceResolution().GetWorkload(),
		r.GetDestinationResolution().GetWorkload())
}

// readMemory reads the live heap, the heap in use and the resident set from
// verdictd's Prometheus text at http://addr/metrics.
func readMemory(ctx context.Context, addr string) (Memory, error) {
	names := []string{"go_gc_heap_live_bytes", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"}
	vals, err := readMetrics(ctx, addr, names...)
	if err != nil {
		return Memory{}, err
	}
	for _, n := range names {
		if _, ok := vals[n]; !ok {
			return Memory{}, fmt.Errorf("metrics: %s missing", n)
		}
	}
	return Memory{HeapLive: vals[names[0]], HeapInuse: vals[names[1]], RSS: vals[names[2]]}, nil
}

func writeColdStart(w io.Writer, r *ColdStartResult) {
	fmt.Fprintf(w, "cold start: %d workloads + %d policies (%d resources, revision %d), seeded in %v\n",
		r.Workloads, r.Policies, r.Keys, r.Revision, r.SeedTime.Round(time.Millisecond))
	fmt.Fprintf(w, "  empty verdictd: heap live %.1f MiB, RSS %.1f MiB\n", r.Empty.HeapLive/(1<<20), r.Empty.RSS/(1<<20))
	for i, s := range r.Starts {
		fmt.Fprintf(w, "  start %d: start → SERVING %v, start → deciding at revision %v; heap live %.1f MiB (%.0f B/workload, %.0f over the empty one), "+
			"in use %.1f MiB, RSS %.1f MiB (%.0f B/workload); after a forced GC: heap live %.1f MiB (%.0f B/workload); %d probes answered as before\n",
			i+1, s.ToServing.Round(time.Millisecond), s.ToReady.Round(time.Millisecond), s.Memory.HeapLive/(1<<20),
			s.HeapPerWorkload, s.HeapOverEmptyPerWorkload, s.Memory.HeapInuse/(1<<20), s.Memory.RSS/(1<<20), s.RSSPerWorkload,
			s.AfterGC.HeapLive/(1<<20), s.LivePerWorkload, s.Checked)
	}
}

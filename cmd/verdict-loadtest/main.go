// Command verdict-loadtest measures verdictd: it starts one on an embedded etcd
// (or uses --addr), loads a generated policy set, and runs the scenarios —
// unary (closed and open loop), batch, stream, churn, fanout — each next to the
// same harness against an empty handler served with verdictd's gRPC options,
// in the same run. Every run is bounded and stops by itself.
//
// Named only: check and check-open (Envoy's ext_authz Check, issue 14),
// compact and compact-stream (flows by identity, issue 13), and
// workload-churn (issue 13 item 6): workload puts at --workload-rate on a
// store preloaded with --workloads-loaded workloads while Decide runs by
// address, each put's visibility awaited with min_revision, every answer
// checked against the one before the churn.
//
// The cold-start subcommand seeds a verdictd's embedded etcd with workloads
// and policies (issue 13 item 6: 100,000 and 10,000), stops it, starts it
// again on the same data and measures process start → SERVING and → deciding
// at the seeded revision, then its live heap and resident set per workload.
//
// The ab subcommand (make ab) is a same-run A/B of make bench and make
// loadtest between the working tree and a base git revision, in alternated
// rounds, printing each row's medians and their ratio (ab.go).
//
// The etcd-soak subcommand writes --writes workload puts (default
// 1,000,000) to a verdictd on its embedded etcd, with verdictd's retention
// defaults or the --retention and --retention-revisions given, and samples
// the database file and verdict_etcd_* metrics along the way: with
// retention working, the file stops growing.
//
//	verdict-loadtest [flags] [scenario...]
//	verdict-loadtest cold-start [--workloads N] [--policies N] [--restarts N] [--external-etcd] [--profile-dir DIR] [--json]
//	verdict-loadtest ab --base REV [--rounds N] [--bench REGEX] [--benchtime T] [--loadtest-args ARGS] [--out DIR]
//	verdict-loadtest etcd-soak [--writes N] [--workloads N] [--writers N] [--retention D] [--retention-revisions N] [--json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Config is the load test's configuration; flags only in main.
type Config struct {
	Addr        string        // an existing verdictd; empty: start one
	Verdictd    string        // the verdictd binary to start
	Policies    int           // generated policies to load
	Scopes      int           // generated scopes
	Seed        uint64        // generator seed
	Duration    time.Duration // per scenario and target
	Warmup      time.Duration
	Requests    int64 // per scenario and target; 0: the duration bounds it
	Concurrency int
	Connections int
	Rate        float64 // open-loop unary rate; 0: skip the open-loop run
	CheckRate   float64 // check-open: Envoy Check calls/s
	CheckFlows  int     // check, check-open: distinct flows (and up to twice as many workloads)
	BatchSize   int
	Streams     int
	Window      int
	WriteRate   float64
	ChurnRate   float64 // Decide calls/s during churn; 0: closed loop
	EtcdParent  string  // where the started verdictd's etcd data directory is made
	Unix        bool    // serve on Unix sockets instead of loopback TCP
	// Metrics is the started verdictd's --metrics-listen (127.0.0.1:0: a
	// free port; empty: none), or with Addr that verdictd's metrics listener.
	Metrics string
	// ProfileDir receives a CPU profile of verdictd per scenario run against
	// it (<scenario>.cpu.pprof), from its loopback metrics listener.
	ProfileDir string
	// CPUProfile receives the load tester's own CPU profile of the run: it
	// shares the cores with the server it measures.
	CPUProfile string
	// Workload churn (issue 13 item 6): puts/s, the goroutines making them,
	// and the workloads loaded first.
	WorkloadRate    float64
	WorkloadWriters int
	WorkloadsLoaded int
	Fanout          int // WatchRules streams
	Workloads       int // distinct workloads the fan-out streams watch
	JSON            bool
	Scenarios       []string
	// DecisionLogAB compares verdictd with every decision logged and without
	// (issue 17): Rounds alternated rounds per form, the log file in LogDir.
	DecisionLogAB bool
	Rounds        int
	LogDir        string
	Timeout       time.Duration // the whole run
}

// defaultScenarios run when none is named; allScenarios adds Envoy's Check
// (issue 14), which loads workloads too, and the compact path (issue 13:
// identities registered with Identify, flows by identity, packed).
var (
	defaultScenarios = []string{"unary", "open", "batch", "stream", "churn", "fanout"}
	allScenarios     = append(slices.Clone(defaultScenarios), "check", "check-open", "compact", "compact-stream",
		"workload-churn")
)

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.Addr == "" && c.Verdictd == "" {
		return fmt.Errorf("--verdictd: the binary to start is required without --addr")
	}
	if c.Policies < 0 || c.Concurrency < 1 || c.Connections < 1 || c.BatchSize < 1 || c.BatchSize > 1000 ||
		c.Streams < 1 || c.Window < 1 || c.Fanout < 1 || c.Workloads < 1 {
		return fmt.Errorf("counts must be positive (batch size at most 1000)")
	}
	if c.Duration <= 0 || c.Duration > 10*time.Minute || c.Timeout <= 0 {
		return fmt.Errorf("--duration must be in (0, 10m] and --timeout positive: runs are bounded")
	}
	if c.WriteRate <= 0 || c.WriteRate > 10000 {
		return fmt.Errorf("--write-rate must be in (0, 10000]")
	}
	if c.WorkloadRate <= 0 || c.WorkloadRate > 10000 || c.WorkloadWriters < 1 || c.WorkloadWriters > 64 {
		return fmt.Errorf("--workload-rate must be in (0, 10000] and --workload-writers in [1, 64]")
	}
	if c.WorkloadsLoaded < 2 || c.WorkloadsLoaded > 1_000_000 {
		return fmt.Errorf("--workloads-loaded must be in [2, 1000000]")
	}
	if c.ChurnRate < 0 || c.Rate < 0 {
		return fmt.Errorf("--rate and --churn-rate must not be negative")
	}
	if c.CheckRate <= 0 || c.CheckFlows < 1 || c.CheckFlows > 8192 {
		return fmt.Errorf("--check-rate must be positive and --check-flows in [1, 8192]")
	}
	if c.ProfileDir != "" && c.Addr != "" && c.Metrics == "" {
		return fmt.Errorf("--profile-dir with --addr needs --verdictd-metrics: that verdictd's loopback metrics listener")
	}
	if c.DecisionLogAB {
		if c.ProfileDir != "" {
			return fmt.Errorf("--decision-log-ab does not take profiles (--profile-dir)")
		}
		if c.Addr != "" {
			return fmt.Errorf("--decision-log-ab starts its own two verdictd processes: no --addr")
		}
		if c.Rounds < 1 || c.Rounds > 20 {
			return fmt.Errorf("--rounds must be in [1, 20]")
		}
		if c.Rate <= 0 && slices.Contains(c.Scenarios, "open") {
			return fmt.Errorf("--decision-log-ab: the open form needs --rate")
		}
		for _, s := range c.Scenarios {
			if !contains(logABForms, s) {
				return fmt.Errorf("--decision-log-ab: scenario %q is not compared (have %s)", s, strings.Join(logABForms, ", "))
			}
		}
		return nil
	}
	for _, s := range c.Scenarios {
		if !contains(allScenarios, s) {
			return fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(allScenarios, ", "))
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "serve-baseline" {
		return serveBaseline(ctx, args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "cold-start" {
		return coldStart(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "ab" {
		return abMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "etcd-soak" {
		return etcdSoak(ctx, args[1:], stdout, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "verdict-loadtest:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	measure := func() (bool, error) { return Run(ctx, cfg, stdout, stderr, log) }
	if cfg.DecisionLogAB {
		measure = func() (bool, error) { return RunDecisionLogAB(ctx, cfg, stdout, stderr) }
	}
	if cfg.CPUProfile != "" {
		stopProfile, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			fmt.Fprintln(stderr, "verdict-loadtest:", err)
			return 3
		}
		defer stopProfile()
	}
	ok, err := measure()
	if err != nil {
		fmt.Fprintln(stderr, "verdict-loadtest:", err)
		return 3
	}
	if !ok {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("verdict-loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c Config
	fs.StringVar(&c.Addr, "addr", "", "target an existing verdictd at host:port (default: start one)")
	fs.StringVar(&c.Verdictd, "verdictd", defaultVerdictd(), "the verdictd binary to start")
	fs.IntVar(&c.Policies, "policies", 10000, "generated policies to load (engine/policygen)")
	fs.IntVar(&c.Scopes, "scopes", 0, "generated scopes")
	fs.Uint64Var(&c.Seed, "seed", 1, "generator seed")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "measured time per scenario and target")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "unmeasured time before each closed-loop measurement")
	fs.Int64Var(&c.Requests, "requests", 0, "stop a scenario after this many calls (0: the duration decides)")
	fs.IntVar(&c.Concurrency, "concurrency", 32, "closed-loop workers (and open-loop maximum in flight: 0 picks)")
	fs.IntVar(&c.Connections, "connections", 4, "client connections")
	fs.Float64Var(&c.Rate, "rate", 10000, "open-loop unary rate, calls/s")
	fs.Float64Var(&c.CheckRate, "check-rate", 5000, "check-open: Envoy Check calls/s (open loop)")
	fs.IntVar(&c.CheckFlows, "check-flows", 1024, "check, check-open: distinct flows; each end is a workload with an address and a SPIFFE ID")
	fs.IntVar(&c.BatchSize, "batch-size", 100, "flows per DecideBatch call and per compact batch (≤ 1000)")
	fs.IntVar(&c.Streams, "streams", 4, "DecideStream and DecideCompactStream streams")
	fs.IntVar(&c.Window, "window", 128, "requests in flight per stream")
	fs.Float64Var(&c.WriteRate, "write-rate", 100, "churn: policy writes per second")
	fs.Float64Var(&c.ChurnRate, "churn-rate", 10000,
		"churn: Decide calls/s (open loop) during the writes; 0: closed loop at --concurrency, saturating the machine")
	fs.Float64Var(&c.WorkloadRate, "workload-rate", 1000, "workload-churn: workload puts per second (≤ 10000)")
	fs.IntVar(&c.WorkloadWriters, "workload-writers", 32,
		"workload-churn: goroutines making the puts, each waiting for its put's acknowledgement (its visibility is awaited beside it; ≤ 64)")
	fs.IntVar(&c.WorkloadsLoaded, "workloads-loaded", 10000, "workload-churn: workloads loaded before the churn (100000: issue 13's case)")
	fs.BoolVar(&c.Unix, "unix", false, "serve the started verdictd and the baseline on Unix sockets instead of loopback TCP")
	fs.StringVar(&c.EtcdParent, "etcd-tmpdir", "",
		"directory for the started verdictd's etcd data (default: the system's; /dev/shm takes the disk's fsync out of the write lag)")
	fs.StringVar(&c.Metrics, "verdictd-metrics", "",
		"the started verdictd's --metrics-listen (loopback; 127.0.0.1:0 picks a free port; default none), or with --addr "+
			"that verdictd's metrics listener; it serves /debug/pprof")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write the load tester's own CPU profile of the whole run to this file")
	fs.StringVar(&c.ProfileDir, "profile-dir", "",
		"write a CPU profile of verdictd for each scenario run against it to DIR/<scenario>.cpu.pprof, taken from its "+
			"loopback metrics listener (started on a free port unless --verdictd-metrics names one)")
	fs.IntVar(&c.Fanout, "fanout-streams", 2000, "fanout: WatchRules streams")
	fs.IntVar(&c.Workloads, "fanout-workloads", 50, "fanout: distinct workloads the streams watch")
	fs.BoolVar(&c.JSON, "json", false, "print the reports as JSON")
	fs.DurationVar(&c.Timeout, "timeout", 15*time.Minute, "bound on the whole run")
	fs.BoolVar(&c.DecisionLogAB, "decision-log-ab", false,
		"compare two started verdictd, one logging every decision to a JSON-lines file and one not, in alternated rounds of "+
			strings.Join(logABForms, ", ")+"; prints p50, p99, decisions/s, ratios and the records written and dropped")
	fs.IntVar(&c.Rounds, "rounds", 3, "--decision-log-ab: rounds per form and side")
	fs.StringVar(&c.LogDir, "decision-log-dir", "", "--decision-log-ab: directory of the decision log file (default: the system's temporary directory)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: verdict-loadtest [flags] [%s ...]\n(default: %s)\n"+
			"       verdict-loadtest cold-start [flags] (cold-start --help lists them)\n"+
			"       verdict-loadtest ab --base REV [flags] (ab --help lists them)\n"+
			"       verdict-loadtest etcd-soak [flags] (etcd-soak --help lists them)\n\n",
			strings.Join(allScenarios, "|"), strings.Join(defaultScenarios, " "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Scenarios = fs.Args()
	if len(c.Scenarios) == 0 {
		c.Scenarios = defaultScenarios
		if c.DecisionLogAB {
			c.Scenarios = logABForms
		}
	}
	return c, c.Validate()
}

// defaultVerdictd is bin/verdictd beside this binary (make build puts both there).
func defaultVerdictd() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	cand := strings.TrimSuffix(exe, "verdict-loadtest") + "verdictd"
	if _, err := os.Stat(cand); err == nil {
		return cand
	}
	return ""
}

// signalContext ends ctx on SIGTERM too (the load tester stops its children so).
func signalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

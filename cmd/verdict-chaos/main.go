// Command verdict-chaos runs verdict under faults (the default) or under a
// long mixed load (soak), with real processes on loopback, and prints the
// figures: see package chaos. Every run is bounded and stops by itself;
// processes and temporary directories are removed at the end.
//
//	verdict-chaos [flags]          # make chaos (the faults)
//	verdict-chaos hostile [flags]  # make chaos (hostile clients)
//	verdict-chaos soak [flags]     # make soak
//
// With hostile, the probe Decides run in a process of their own: the
// binary runs itself as `verdict-chaos probe` (not for direct use).
//
// Exit codes: 0 the run passed, 1 it ran but a target was missed (failed
// decisions, a digest mismatch, a lost write, a leak), 2 usage, 3 the run
// could not be carried out.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/verdictpdp/verdict/loadtest/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "soak" {
		return runSoak(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "hostile" {
		return runHostile(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "probe" { // hidden: the hostile run's probe process
		return runProbe(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	fs := flag.NewFlagSet("verdict-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.Config
	fs.StringVar(&cfg.Verdictd, "verdictd", defaultVerdictd(), "the verdictd binary the replicas run")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for etcd's data and the replicas' logs (default: a temporary one, removed)")
	schedule := fs.String("schedule", "full", "full (every fault, held --hold) or smoke (every fault once, briefly)")
	hold := fs.Duration("hold", 8*time.Second, "full schedule: how long each fault lasts (blackhole ≥ 10s, compaction ≥ 12s)")
	after := fs.Duration("after", 6*time.Second, "full schedule: steady load between faults")
	fs.Float64Var(&cfg.DecideRate, "rate", 200, "Decide calls per second to each replica")
	fs.DurationVar(&cfg.DecideTimeout, "decide-timeout", 100*time.Millisecond, "deadline of each Decide call")
	fs.Float64Var(&cfg.WriteRate, "write-rate", 10, "policy writes per second")
	timeout := fs.Duration("timeout", 15*time.Minute, "bound on the whole run")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log each step as it starts (stderr)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: verdict-chaos [flags]\n       verdict-chaos hostile [flags]\n       verdict-chaos soak [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch *schedule {
	case "full":
		cfg.Schedule = chaos.FullSchedule(*hold, *after)
	case "smoke":
		cfg.Schedule = chaos.SmokeSchedule()
	default:
		fmt.Fprintf(stderr, "verdict-chaos: --schedule %q: full or smoke\n", *schedule)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "verdict-chaos: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg.Logger = logger(stderr, *verbose)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := chaos.Run(ctx, cfg)
	return finish("verdict-chaos", rep, err, rep != nil && rep.Pass, *jsonOut, stdout, stderr)
}

// report is what every run's report can do.
type report interface {
	WriteJSON(io.Writer) error
	WriteText(io.Writer)
}

// finish prints a run's report (JSON or text) and says its exit code: 3 the
// run could not be carried out, 1 a target was missed, 0 it passed.
func finish[R report](name string, rep R, err error, pass, jsonOut bool, stdout, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 3
	}
	if jsonOut {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return 3
		}
	} else {
		rep.WriteText(stdout)
	}
	if !pass {
		return 1
	}
	return 0
}

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verdict-chaos soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.SoakConfig
	fs.StringVar(&cfg.Verdictd, "verdictd", defaultVerdictd(), "the verdictd binary the replicas run")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for etcd's data and the replicas' logs (default: a temporary one, removed)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long the mixed load runs")
	fs.DurationVar(&cfg.Sample, "sample", time.Minute, "how often goroutines and heap are sampled")
	fs.Float64Var(&cfg.DecideRate, "rate", 300, "Decide calls per second to each replica")
	fs.Float64Var(&cfg.WriteRate, "write-rate", 20, "policy writes per second")
	fs.IntVar(&cfg.RuleStreams, "rule-streams", 50, "WatchRules streams open at any time (each lives 1-5 s, then another opens)")
	fs.IntVar(&cfg.ResourceStreams, "resource-streams", 4, "WatchResources streams open at any time (each lives 2-10 s)")
	fs.IntVar(&cfg.DecideStreams, "decide-streams", 4, "DecideStream streams open at any time (each lives 1-5 s)")
	timeout := fs.Duration("timeout", 0, "bound on the whole run (default: duration + 5m)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log each sample as it is taken (stderr)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "verdict-chaos soak: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *timeout == 0 {
		*timeout = cfg.Duration + 5*time.Minute
	}
	cfg.Logger = logger(stderr, *verbose)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := chaos.Soak(ctx, cfg)
	return finish("verdict-chaos soak", rep, err, rep != nil && rep.Pass, *jsonOut, stdout, stderr)
}

func logger(w io.Writer, verbose bool) *slog.Logger {
	if !verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// defaultVerdictd is bin/verdictd beside this binary (make builds both there).
func defaultVerdictd() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	cand := strings.TrimSuffix(exe, "verdict-chaos") + "verdictd"
	if _, err := os.Stat(cand); err == nil {
		return cand
	}
	return ""
}

func runHostile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verdict-chaos hostile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.HostileConfig
	fs.StringVar(&cfg.Verdictd, "verdictd", defaultVerdictd(), "the verdictd binary")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for etcd's data and verdictd's log (default: a temporary one, removed)")
	fs.IntVar(&cfg.StormStreams, "storm-streams", 1000, "streams opened and cancelled per stream RPC")
	fs.IntVar(&cfg.SilentStreams, "silent-streams", 2000, "WatchRules streams that never read")
	fs.DurationVar(&cfg.SilentFor, "silent-for", 15*time.Second, "how long the silent streams are held under writes")
	fs.Float64Var(&cfg.WriteRate, "write-rate", 20, "policy writes per second while the silent or reading streams are held")
	reading := fs.String("reading-streams", "2000,6000", "sizes of the reading-streams scenarios: WatchRules streams of distinct workloads, comma-separated")
	fs.DurationVar(&cfg.ReadingFor, "reading-for", 10*time.Second, "how long the reading streams are held under writes")
	fs.IntVar(&cfg.Concurrent, "concurrent", 4, "oversized batches and explain floods sent at once")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds of oversized batches and of explain floods")
	fs.Float64Var(&cfg.ProbeRate, "rate", 100, "probe Decide calls per second")
	fs.DurationVar(&cfg.ProbeTimeout, "decide-timeout", 100*time.Millisecond, "deadline of each probe Decide")
	fs.DurationVar(&cfg.Settle, "settle", 30*time.Second, "how long goroutines and heap may take to come back after each scenario")
	fs.DurationVar(&cfg.IdentifyFor, "identify-for", 10*time.Second, "how long the Identify flood's attacker registers fresh tag sets (0: skip the scenario)")
	fs.IntVar(&cfg.IdentifyConns, "identify-conns", 2, "the Identify flood's attacker connections (one caller)")
	fs.DurationVar(&cfg.LogFloodFor, "log-flood-for", 10*time.Second, "how long the decision-log flood lasts (0: skip it, and run verdictd without a decision log)")
	logMaxSize := fs.String("log-max-size", "8MiB", "verdictd's --decision-log-max-size for the run (B, KiB, MiB, GiB)")
	fs.IntVar(&cfg.LogMaxFiles, "log-max-files", 3, "verdictd's --decision-log-max-files for the run")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	probes := fs.String("probes", "process", "where the probe Decides run: process (a process of their own) or inline (beside the attackers)")
	fs.StringVar(&cfg.ProfileDir, "cpu-profiles", "", "directory for CPU profiles of verdictd while each scenario runs (default: none)")
	fs.DurationVar(&cfg.ProfileFor, "cpu-profile-for", 2*time.Second, "length of each CPU profile slice (a scenario gets as many as it lasts)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log each scenario as it starts (stderr)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "verdict-chaos hostile: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for _, f := range strings.Split(*reading, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "verdict-chaos hostile: --reading-streams %q: positive numbers, comma-separated\n", *reading)
			return 2
		}
		cfg.ReadingStreams = append(cfg.ReadingStreams, n)
	}
	var err error
	if cfg.LogMaxSize, err = parseSize(*logMaxSize); err != nil {
		fmt.Fprintf(stderr, "verdict-chaos hostile: --log-max-size: %v\n", err)
		return 2
	}
	// 0 skips a flood; the config's zero is its default.
	for _, d := range []*time.Duration{&cfg.IdentifyFor, &cfg.LogFloodFor} {
		if *d <= 0 {
			*d = -1
		}
	}
	switch *probes {
	case "process":
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "verdict-chaos hostile: --probes process: %v\n", err)
			return 3
		}
		cfg.ProbeCommand = []string{exe, "probe"}
	case "inline":
	default:
		fmt.Fprintf(stderr, "verdict-chaos hostile: --probes %q: process or inline\n", *probes)
		return 2
	}
	cfg.Logger = logger(stderr, *verbose)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := chaos.Hostile(ctx, cfg)
	return finish("verdict-chaos hostile", rep, err, rep != nil && rep.Pass, *jsonOut, stdout, stderr)
}

// parseSize reads a byte count with an optional unit: B, KiB, MiB or GiB.
func parseSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: a positive size such as 8MiB", s)
	}
	return n * mult, nil
}

// runProbe is the hostile run's probe process: Decides at --rate with
// --timeout each to --addr, one JSON line per call on stdout, until stdin
// ends (the run closes it) or a signal.
func runProbe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verdict-chaos probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.ProbeConfig
	fs.StringVar(&cfg.Addr, "addr", "", "verdictd's gRPC address")
	fs.Float64Var(&cfg.Rate, "rate", 100, "Decide calls per second")
	fs.DurationVar(&cfg.Timeout, "timeout", 100*time.Millisecond, "deadline of each Decide")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	if err := chaos.RunProbe(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "verdict-chaos probe:", err)
		return 3
	}
	return 0
}

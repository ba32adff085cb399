// Command compare runs the whole peer comparison in one process: for each
// generator profile (sparse: few candidate rules per flow; dense: tens to
// hundreds of matching rules per flow, issue 19's shape) and each size it loads
// every peer (verdict, the linear scan, OPA's two formulations,
// verdict under DenyOverrides, cedar-go and the quick index) with the same generated set, checks
// that each agrees with verdict on the flows, times it, and prints one markdown
// table with ns/decision, allocations, the heap kept after load and the ratio to
// verdict measured in the same run.
//
//	go run ./cmd/compare -profiles sparse,dense -sizes 1000,10000,100000 -flows 4096
//
// It exits 1 when a peer disagrees with verdict.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/verdictpdp/verdict/loadtest/peers"
)

// config is the command's flags.
type config struct {
	profiles      []string
	sizes         []int
	flows         int
	agreeMin      int           // flows every peer decides for the agreement check, however slow
	agreeBudget   time.Duration // per peer and size, past agreeMin
	timeBudget    time.Duration // per peer and size
	loadLimit     time.Duration
	decisionLimit time.Duration
}

func main() {
	var cfg config
	profiles := flag.String("profiles", "sparse,dense", "generator profiles, comma-separated: sparse (few candidate rules per flow), dense (tens to hundreds of matching rules per flow)")
	sizes := flag.String("sizes", "1000,10000,100000", "policy-set sizes, comma-separated")
	flag.IntVar(&cfg.flows, "flows", 4096, "generated flows per size: the agreement sample and the timed round-robin")
	flag.IntVar(&cfg.agreeMin, "agree-min", 100, "flows every peer decides in the agreement check, however slow")
	flag.DurationVar(&cfg.agreeBudget, "agree-budget", 20*time.Second, "time per peer and size for the agreement check, past -agree-min")
	flag.DurationVar(&cfg.timeBudget, "time-budget", 3*time.Second, "timed decisions per peer and size")
	flag.DurationVar(&cfg.loadLimit, "load-limit", 5*time.Minute, "a peer whose load takes longer is reported as too slow")
	flag.DurationVar(&cfg.decisionLimit, "decision-limit", 10*time.Second, "a peer one of whose decisions takes longer is reported as too slow")
	flag.Parse()
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "compare: -sizes: %q is not a positive number\n", s)
			os.Exit(2)
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	for s := range strings.SplitSeq(*profiles, ",") {
		s = strings.TrimSpace(s)
		if _, err := peers.ParseProfile(s); err != nil {
			fmt.Fprintln(os.Stderr, "compare: -profiles:", err)
			os.Exit(2)
		}
		cfg.profiles = append(cfg.profiles, s)
	}
	if cfg.flows <= 0 {
		fmt.Fprintln(os.Stderr, "compare: -flows must be positive")
		os.Exit(2)
	}
	ok, err := run(context.Background(), cfg, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// row is one peer at one size.
type row struct {
	profile string
	size    int
	peer    peers.Peer
	loaded  *peers.Loaded
	timing  peers.Timing
	agree   *peers.Agreement
	problem string // why it was not (fully) measured
}

// run compares the peers; progress goes to log, the table to out. It reports
// whether every peer agreed with its reference.
func run(ctx context.Context, cfg config, out, log io.Writer) (bool, error) {
	start := time.Now()
	fmt.Fprintf(log, "go %s, %s/%s, %d CPUs, GOMAXPROCS %d\n", runtime.Version(), runtime.GOOS, runtime.GOARCH,
		runtime.NumCPU(), runtime.GOMAXPROCS(0))
	var rows []*row
	agreed := true
	for _, pn := range cfg.profiles {
		profile, _ := peers.ParseProfile(pn) // checked with the flags
		for _, n := range cfg.sizes {
			flows := peers.Flows(profile, n, cfg.flows)
			want := map[string][]peers.Outcome{}
			for _, p := range peers.Peers() {
				r := &row{profile: pn, size: n, peer: p}
				rows = append(rows, r)
				fmt.Fprintf(log, "%s: %s, %d policies: loading\n", p.Name, pn, n)
				l, err := peers.Load(ctx, p, profile, n, cfg.loadLimit)
				if err != nil {
					if !errors.Is(err, peers.ErrTooSlow) {
						return false, err
					}
					r.problem = "load over " + cfg.loadLimit.String()
					continue
				}
				r.loaded = l
				fmt.Fprintf(log, "%s: %d policies: loaded in %s, %s kept; deciding\n", p.Name, n,
					l.LoadTime.Round(time.Millisecond), mib(l.Heap))
				sample := cfg.flows
				if p.Reference != "" {
					sample = cfg.agreeMin
				}
				got, err := peers.DecideAll(l.Decider, flows, sample, cfg.agreeBudget, cfg.decisionLimit)
				if err != nil {
					if !errors.Is(err, peers.ErrTooSlow) {
						return false, fmt.Errorf("%s: %w", p.Name, err)
					}
					r.problem = err.Error()
					continue
				}
				switch {
				case p.Reference == "":
					want[p.Name] = got
				case want[p.Reference] == nil:
					r.problem = "reference " + p.Reference + " not measured"
					agreed = false
					continue
				default:
					a := peers.Agree(want[p.Reference], got)
					r.agree = &a
					fmt.Fprintf(log, "%s vs %s: %s\n", p.Name, p.Reference, a)
					for i, m := range a.Mismatches {
						if i == 5 {
							break
						}
						f := flows[m.Flow]
						fmt.Fprintf(log, "  flow %d %v -> %v %s %d: %s says %s, %s says %s\n", m.Flow, f.Source, f.Destination,
							f.Protocol, f.Port, p.Reference, m.Want, p.Name, m.Got)
					}
					if len(a.Mismatches) > 0 {
						agreed = false
					}
				}
				r.timing, err = peers.Time(l.Decider, flows, 1<<30, cfg.timeBudget, cfg.decisionLimit)
				if err != nil {
					return false, fmt.Errorf("%s: %w", p.Name, err)
				}
				if r.timing.LimitExceeded {
					r.problem = "one decision over " + cfg.decisionLimit.String()
				}
				r.loaded.Decider = nil // let the next peer's heap be measured alone
				runtime.GC()
			}
		}
	}
	printTable(out, rows)
	printTargets(out, rows)
	fmt.Fprintf(out, "\nwhole run: %s\n", time.Since(start).Round(time.Second))
	return agreed, nil
}

func printTable(out io.Writer, rows []*row) {
	ref := func(r *row) *row {
		for _, x := range rows {
			if x.profile == r.profile && x.size == r.size && x.peer.Name == r.peer.Reference {
				return x
			}
		}
		return nil
	}
	fmt.Fprintln(out, "\n| profile | policies | implementation | combine | ns/decision | allocs/decision | B/decision | heap after load | load time | × verdict | agreement (flows, disagreeing) |")
	fmt.Fprintln(out, "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range rows {
		cells := []string{r.profile, strconv.Itoa(r.size), r.peer.Name, r.peer.Combine.String(), "—", "—", "—", "—", "—", "—", "—"}
		if r.peer.Reference == "" {
			cells[10] = "reference"
		}
		if r.loaded != nil {
			cells[7], cells[8] = mib(r.loaded.Heap), r.loaded.LoadTime.Round(time.Millisecond).String()
		}
		if t := r.timing; t.Ops > 0 {
			cells[4] = thousands(t.NsPerOp)
			cells[5] = thousands(t.AllocsPerOp)
			cells[6] = thousands(t.BytesPerOp)
			if rf := ref(r); rf != nil && rf.timing.Ops > 0 {
				cells[9] = fmt.Sprintf("%.1f×", t.NsPerOp/rf.timing.NsPerOp)
			} else if r.peer.Reference == "" {
				cells[9] = "1×"
			}
		}
		if r.agree != nil {
			cells[10] = fmt.Sprintf("%d, %d", r.agree.Compared, len(r.agree.Mismatches))
		}
		if r.problem != "" {
			cells[4] = "not measured: " + r.problem
			if r.timing.LimitExceeded {
				cells[4] = fmt.Sprintf("%s (one decision: %s)", r.problem, r.timing.Elapsed.Round(time.Millisecond))
			}
		}
		fmt.Fprintf(out, "| %s |\n", strings.Join(cells, " | "))
	}
}

// printTargets checks the targets at 10k policies: the engine at least
// 250× faster than OPA's faster formulation and than the linear scan, and
// 1,000× faster than cedar-go.
func printTargets(out io.Writer, rows []*row) {
	for _, p := range peers.Profiles {
		printProfileTargets(out, p.Name, rows)
	}
}

// printProfileTargets prints one profile's ratios at 10,000 policies.
func printProfileTargets(out io.Writer, profile string, rows []*row) {
	ns := func(name string) float64 {
		for _, r := range rows {
			if r.profile == profile && r.size == 10_000 && r.peer.Name == name && r.timing.Ops > 0 && !r.timing.LimitExceeded {
				return r.timing.NsPerOp
			}
		}
		return 0
	}
	v, vd := ns(peers.VerdictName), ns(peers.VerdictDenyName)
	if v == 0 || vd == 0 {
		return
	}
	opa := slices.DeleteFunc([]float64{ns(peers.OPARulesName), ns(peers.OPADataName)}, func(x float64) bool { return x == 0 })
	fmt.Fprintf(out, "\n%s profile, targets at 10,000 policies (peer time / verdict time, same run):\n", profile)
	target := func(what string, peer, ref, want float64) {
		if peer == 0 {
			fmt.Fprintf(out, "  %-28s not measured\n", what)
			return
		}
		got := peer / ref
		verdict := "met"
		if got < want {
			verdict = "NOT met"
		}
		fmt.Fprintf(out, "  %-28s %10.1f×  (target ≥ %.0f×: %s)\n", what, got, want, verdict)
	}
	fastest := 0.0
	if len(opa) > 0 {
		fastest = slices.Min(opa)
	}
	target("vs OPA, faster formulation", fastest, v, 250)
	target("vs cedar-go", ns(peers.CedarName), vd, 1000)
	target("vs linear scan", ns(peers.LinearName), v, 250)
	if vn := ns(peers.VerdictNoCacheName); vn > 0 {
		fmt.Fprintln(out, "the same, against verdict without its decision cache (every decision scans):")
		target("vs OPA, faster formulation", fastest, vn, 250)
		target("vs linear scan", ns(peers.LinearName), vn, 250)
		target("vs quick index", ns(peers.QuickName), vn, 5)
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// thousands formats x with no decimals and thousands separators (x < 10: one decimal).
func thousands(x float64) string {
	if x < 0.05 { // a stray allocation of the runtime over many decisions
		return "0"
	}
	if x < 10 {
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	s := strconv.FormatFloat(x, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

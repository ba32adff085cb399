package main

// The ab subcommand: a same-run A/B of make bench and make loadtest between
// the working tree and a base git revision. The base is checked out in a
// temporary git worktree; both sides' benchmark binaries and verdictd are
// built once; then rounds alternate the sides (base first in odd rounds, the
// working tree first in even ones, so that a drift of the machine's load
// weighs on both alike), and one table gives each row's medians and their
// ratio. This load tester drives both verdictd (one client, one generated set
// and one set of flows for both sides), unless --own-loadtester.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/verdictpdp/verdict/loadtest"
)

// ABConfig is the ab subcommand's configuration.
type ABConfig struct {
	Repo         string        // a directory of the repository's working tree
	Base         string        // the git revision compared against
	Rounds       int           // alternated rounds per row
	BenchPkgs    []string      // package patterns whose benchmarks run (make bench's)
	Bench        string        // -test.bench; empty: no benchmarks
	Benchtime    string        // -test.benchtime
	Loadtest     bool          // run the load test too
	LoadtestArgs []string      // flags and scenarios of each load-test run (make loadtest's)
	OwnLoadtest  bool          // each side drives its verdictd with its own load tester
	Out          string        // keeps every run's raw output there
	Timeout      time.Duration // the whole A/B
}

// makeLoadtestArgs are make loadtest's flags.
var makeLoadtestArgs = []string{"--policies", "10000", "--duration", "3s", "--warmup", "1s"}

func parseABFlags(args []string, stderr io.Writer) (ABConfig, error) {
	fs := flag.NewFlagSet("verdict-loadtest ab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := ABConfig{}
	var pkgs, lt string
	fs.StringVar(&c.Repo, "repo", ".", "a directory of the working tree to compare (the new side, uncommitted changes included)")
	fs.StringVar(&c.Base, "base", "", "the git revision to compare against (required)")
	fs.IntVar(&c.Rounds, "rounds", 8, "alternated rounds per row")
	fs.StringVar(&pkgs, "bench-pkgs", "./engine/...,./server/", "comma-separated package patterns whose benchmarks run (make bench's)")
	fs.StringVar(&c.Bench, "bench", ".", "benchmarks to run (go test -bench); empty: none")
	fs.StringVar(&c.Benchtime, "benchtime", "2s", "go test -benchtime of each benchmark run")
	fs.BoolVar(&c.Loadtest, "loadtest", true, "run the load test in each round")
	fs.StringVar(&lt, "loadtest-args", strings.Join(makeLoadtestArgs, " "),
		"flags and scenarios of each load-test run, space-separated (make loadtest's by default)")
	fs.BoolVar(&c.OwnLoadtest, "own-loadtester", false,
		"drive each side's verdictd with that side's own load tester (default: this one drives both, so that client, policies and flows are the same)")
	fs.StringVar(&c.Out, "out", "", "keep every run's raw output in this directory")
	fs.DurationVar(&c.Timeout, "timeout", 12*time.Hour, "bound on the whole A/B")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: verdict-loadtest ab --base REV [flags]\n\n"+
			"A same-run A/B of make bench and make loadtest: the working tree against REV (checked out in a temporary\n"+
			"git worktree), both built once, rounds alternated; prints each row's medians and their ratio new/base.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, p := range strings.Split(pkgs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			c.BenchPkgs = append(c.BenchPkgs, p)
		}
	}
	c.LoadtestArgs = strings.Fields(lt)
	switch {
	case c.Base == "":
		return c, errors.New("--base: the revision to compare against is required")
	case c.Rounds < 1 || c.Rounds > 100:
		return c, errors.New("--rounds must be in [1, 100]")
	case c.Bench == "" && !c.Loadtest:
		return c, errors.New("nothing to compare: --bench is empty and --loadtest=false")
	case c.Bench != "" && len(c.BenchPkgs) == 0:
		return c, errors.New("--bench-pkgs: no package")
	case c.Timeout <= 0:
		return c, errors.New("--timeout must be positive")
	}
	for _, a := range c.LoadtestArgs {
		if a == "--json" || a == "--verdictd" || strings.HasPrefix(a, "--verdictd=") || a == "--addr" || strings.HasPrefix(a, "--addr=") {
			return c, fmt.Errorf("--loadtest-args: %s is set by ab", a)
		}
	}
	return c, nil
}

func abMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseABFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "verdict-loadtest ab:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := runAB(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "verdict-loadtest ab:", err)
		return 3
	}
	return 0
}

// abSide is one side of the A/B: a source tree and what was built from it.
type abSide struct {
	name     string // "base" or "new"
	rev      string // the revision, as printed
	dir      string // the source tree
	bin      string // where its binaries are
	verdictd string
	loadtest string               // the load tester driving its verdictd
	benches  []abBenchBinary      // one per package with tests
	samples  map[string][]float64 // row key → one value per round
}

type abBenchBinary struct {
	pkg, dir, path string
}

func runAB(ctx context.Context, cfg ABConfig, stdout, stderr io.Writer) error {
	top, err := gitOut(ctx, cfg.Repo, "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	baseRev, err := gitOut(ctx, top, "rev-parse", "--short", cfg.Base+"^{commit}")
	if err != nil {
		return fmt.Errorf("--base %s: %w", cfg.Base, err)
	}
	newRev, err := gitOut(ctx, top, "rev-parse", "--short", "HEAD")
	if err != nil {
		return err
	}
	if st, _ := gitOut(ctx, top, "status", "--porcelain", "--untracked-files=no"); st != "" {
		newRev += " with uncommitted changes"
	}
	tmp, err := os.MkdirTemp("", "verdict-ab-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	wt := filepath.Join(tmp, "base")
	if _, err := gitOut(ctx, top, "worktree", "add", "--detach", wt, baseRev); err != nil {
		return err
	}
	defer func() {
		// Not ctx: the worktree goes even when the A/B was interrupted.
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := gitOut(cctx, top, "worktree", "remove", "--force", wt); err != nil {
			fmt.Fprintln(stderr, "verdict-loadtest ab:", err)
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	sides := []*abSide{
		{name: "base", rev: baseRev, dir: wt, bin: filepath.Join(tmp, "bin-base"), loadtest: self},
		{name: "new", rev: newRev, dir: top, bin: filepath.Join(tmp, "bin-new"), loadtest: self},
	}
	for _, s := range sides {
		s.samples = map[string][]float64{}
		fmt.Fprintf(stderr, "ab: building %s (%s)\n", s.name, s.rev)
		if err := buildSide(ctx, cfg, s, stderr); err != nil {
			return fmt.Errorf("%s (%s): %w", s.name, s.rev, err)
		}
	}
	if cfg.Out != "" {
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return err
		}
	}
	start, loadBefore := time.Now(), loadAvg()
	for r := 1; r <= cfg.Rounds; r++ {
		order := sides
		if r%2 == 0 {
			order = []*abSide{sides[1], sides[0]}
		}
		if cfg.Bench != "" {
			for _, s := range order {
				fmt.Fprintf(stderr, "ab: round %d/%d, %s, benchmarks (load %s)\n", r, cfg.Rounds, s.name, loadAvg())
				if err := runBenchRound(ctx, cfg, s, r); err != nil {
					return fmt.Errorf("round %d, %s: %w", r, s.name, err)
				}
			}
		}
		if cfg.Loadtest {
			for _, s := range order {
				fmt.Fprintf(stderr, "ab: round %d/%d, %s, load test (load %s)\n", r, cfg.Rounds, s.name, loadAvg())
				if err := runLoadtestRound(ctx, cfg, s, r, stderr); err != nil {
					return fmt.Errorf("round %d, %s: %w", r, s.name, err)
				}
			}
		}
	}
	fmt.Fprintf(stdout, "verdict-loadtest ab: new = %s, base = %s; %d alternated rounds, %s, %s; load average %s before, %s after; GOMAXPROCS %d, %s\n\n",
		sides[1].rev, sides[0].rev, cfg.Rounds, start.UTC().Format("2006-01-02 15:04 UTC"),
		time.Since(start).Round(time.Second), loadBefore, loadAvg(), runtime.GOMAXPROCS(0), cpuModel())
	return writeABTable(stdout, sides[0].samples, sides[1].samples)
}

// buildSide builds a side's verdictd, its benchmark binaries and, with
// --own-loadtester, its load tester. The dependencies come from the build
// cache; the module's own packages compile again for the temporary
// worktree's path. (-trimpath would let a second A/B reuse them, at the
// price of compiling every dependency and the standard library once more:
// the everyday builds are not trimmed.)
func buildSide(ctx context.Context, cfg ABConfig, s *abSide, stderr io.Writer) error {
	if err := os.MkdirAll(s.bin, 0o755); err != nil {
		return err
	}
	if cfg.Loadtest {
		s.verdictd = filepath.Join(s.bin, "verdictd")
		if err := goRun(ctx, s.dir, stderr, "build", "-o", s.verdictd, "./cmd/verdictd"); err != nil {
			return err
		}
		if cfg.OwnLoadtest {
			s.loadtest = filepath.Join(s.bin, "verdict-loadtest")
			if err := goRun(ctx, s.dir, stderr, "build", "-o", s.loadtest, "./cmd/verdict-loadtest"); err != nil {
				return err
			}
		}
	}
	if cfg.Bench == "" {
		return nil
	}
	args := append([]string{"list", "-f", "{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}\t{{.Dir}}{{end}}"}, cfg.BenchPkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Stderr = s.dir, stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		b := abBenchBinary{pkg: pkg, dir: dir,
			path: filepath.Join(s.bin, strings.NewReplacer("/", "_", ".", "_").Replace(pkg)+".test")}
		if err := goRun(ctx, s.dir, stderr, "test", "-c", "-o", b.path, pkg); err != nil {
			return err
		}
		s.benches = append(s.benches, b)
	}
	if len(s.benches) == 0 {
		return fmt.Errorf("no package with tests in %s", strings.Join(cfg.BenchPkgs, ", "))
	}
	return nil
}

func runBenchRound(ctx context.Context, cfg ABConfig, s *abSide, round int) error {
	seen := map[string]string{} // row → the package that gave it this round
	for _, b := range s.benches {
		cmd := exec.CommandContext(ctx, b.path, "-test.run", "^$", "-test.bench", cfg.Bench, "-test.benchmem",
			"-test.benchtime", cfg.Benchtime)
		cmd.Dir = b.dir // benchmarks read testdata/ beside their package
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err2 := keepRaw(cfg, fmt.Sprintf("bench-%s-%02d-%s.txt", s.name, round, filepath.Base(b.path)), out.Bytes()); err2 != nil {
			return err2
		}
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", b.pkg, err, tail(out.String(), 20))
		}
		for key, v := range parseBenchOutput(&out) {
			if prev, ok := seen[key]; ok && prev != b.pkg {
				key = b.pkg + ": " + key // one name in two packages: two rows
			}
			seen[key] = b.pkg
			s.samples[key] = append(s.samples[key], v)
		}
	}
	return nil
}

func runLoadtestRound(ctx context.Context, cfg ABConfig, s *abSide, round int, stderr io.Writer) error {
	args := append([]string{"--verdictd", s.verdictd, "--json"}, cfg.LoadtestArgs...)
	cmd := exec.CommandContext(ctx, s.loadtest, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err2 := keepRaw(cfg, fmt.Sprintf("loadtest-%s-%02d.json", s.name, round), out.Bytes()); err2 != nil {
		return err2
	}
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) { // 1: a scenario saw errors; its reports still count
		return fmt.Errorf("load test: %w\n%s", err, tail(errOut.String(), 20))
	}
	var reports []*loadtest.Report
	if err := json.Unmarshal(out.Bytes(), &reports); err != nil {
		return fmt.Errorf("load test output: %w", err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ab: round %d, %s: a scenario saw errors (the table counts its figures)\n", round, s.name)
	}
	for key, v := range loadtestRows(reports) {
		s.samples[key] = append(s.samples[key], v)
	}
	return nil
}

// benchLine is a result line of go test -bench: the name (with its -N
// GOMAXPROCS suffix), the iterations, then value-unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.+)$`)

// parseBenchOutput reads go test -bench output: a row per benchmark and
// unit ("BenchmarkBuild/policies=10000 ns/op"); a row met twice keeps its last
// value.
func parseBenchOutput(r io.Reader) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			out[m[1]+" "+f[i+1]] = v
		}
	}
	return out
}

// loadtestRows turns verdict's reports (not the empty handler's) into rows:
// decisions/s and the ratio to the empty handler of the same run, p50 and
// p99, each lag's p99.
func loadtestRows(reports []*loadtest.Report) map[string]float64 {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	out := map[string]float64{}
	for _, r := range reports {
		if r.Target != "verdict" {
			continue
		}
		p := "loadtest " + r.Scenario + " "
		if r.Duration > 0 && r.DecisionsPerSec > 0 {
			out[p+"decisions/s"] = r.DecisionsPerSec
			out[p+"p50-ms"] = ms(r.Latency.P50)
			out[p+"p99-ms"] = ms(r.Latency.P99)
		}
		if r.Ratio > 0 {
			out[p+"ratio-to-empty-handler"] = r.Ratio
		}
		for name, l := range r.Lags {
			out[p+name+" p99-ms"] = ms(l.P99)
		}
	}
	return out
}

// higherIsBetter says which way a row's unit points.
func higherIsBetter(key string) bool {
	unit := key[strings.LastIndexByte(key, ' ')+1:]
	return strings.HasSuffix(unit, "/s") || strings.HasPrefix(unit, "ratio")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// writeABTable prints one row per key either side has: the medians of its
// rounds, their ratio new/base, and which way is better.
func writeABTable(w io.Writer, base, cur map[string][]float64) error {
	keys := make([]string, 0, len(base)+len(cur))
	for k := range base {
		keys = append(keys, k)
	}
	for k := range cur {
		if _, ok := base[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		li, lj := strings.HasPrefix(keys[i], "loadtest "), strings.HasPrefix(keys[j], "loadtest ")
		if li != lj {
			return lj // benchmarks first
		}
		return keys[i] < keys[j]
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\tbetter\tbase median\tnew median\tnew/base\trounds")
	for _, k := range keys {
		b, n := median(base[k]), median(cur[k])
		better := "lower"
		if higherIsBetter(k) {
			better = "higher"
		}
		ratio := "—"
		if len(base[k]) > 0 && len(cur[k]) > 0 && b != 0 {
			ratio = fmt.Sprintf("%.3f", n/b)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\n", k, better, figure(b), figure(n), ratio, len(base[k]), len(cur[k]))
	}
	return tw.Flush()
}

// figure prints a value with about four significant digits.
func figure(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.Abs(v) >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func keepRaw(cfg ABConfig, name string, data []byte) error {
	if cfg.Out == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(cfg.Out, name), data, 0o644)
}

func gitOut(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func goRun(ctx context.Context, dir string, stderr io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/listen"
	"github.com/verdictpdp/verdict/internal/writeplan"
	"github.com/verdictpdp/verdict/loadtest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Run runs the configured scenarios and prints the reports. ok is false when a
// scenario saw errors or a fan-out did not reach every stream.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer, log *slog.Logger) (ok bool, err error) {
	addr, metrics := cfg.Addr, cfg.Metrics
	if addr == "" {
		if metrics == "" && cfg.ProfileDir != "" {
			metrics = "127.0.0.1:0"
		}
		d, err := startProcess(ctx, cfg.Verdictd, cfg.EtcdParent, stderr, "--listen", listenArg(cfg), "--metrics-listen", metrics,
			"--data-dir", "", "--log-level", "warn")
		if err != nil {
			return false, fmt.Errorf("start verdictd: %w", err)
		}
		defer d.stop()
		addr, metrics = d.addr, d.metrics
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return false, err
		}
	}
	// profiled runs one scenario against verdictd, under a CPU profile of it
	// with --profile-dir.
	profiled := func(name string, run func() *loadtest.Report) *loadtest.Report {
		if cfg.ProfileDir == "" {
			return run()
		}
		wait := cpuProfile(ctx, metrics, cfg.ProfileDir, name, cfg.Warmup+cfg.Duration)
		r := run()
		if path, err := wait(); err != nil {
			fmt.Fprintf(stderr, "verdict-loadtest: %s: no CPU profile of verdictd: %v\n", name, err)
		} else {
			fmt.Fprintf(stderr, "%s: CPU profile of verdictd in %s\n", name, path)
		}
		return r
	}
	conns, err := dial(addr, cfg.Connections)
	if err != nil {
		return false, err
	}
	defer closeAll(conns)
	if err := waitServing(ctx, conns[0]); err != nil {
		return false, fmt.Errorf("verdictd at %s: %w", addr, err)
	}
	set := policygen.Generate(policygen.Config{Seed: cfg.Seed, Policies: cfg.Policies, Scopes: cfg.Scopes})
	loadStart := time.Now()
	rev, err := load(ctx, conns[0], set.Resources)
	if err != nil {
		return false, fmt.Errorf("load %d policies: %w", cfg.Policies, err)
	}
	fmt.Fprintf(stderr, "loaded %d policies in %v (revision %d)\n", cfg.Policies, time.Since(loadStart).Round(time.Millisecond), rev)
	flows := loadtest.Flows(set.Flows(cfg.Seed+1, 8192))
	warm := flows[0]
	warm.MinRevision = rev
	if _, err := verdictv1.NewDecisionServiceClient(conns[0]).Decide(ctx, warm); err != nil {
		return false, fmt.Errorf("wait for revision %d: %w", rev, err)
	}
	warm.MinRevision = 0

	var checks []*authv3.CheckRequest
	if slices.Contains(cfg.Scenarios, "check") || slices.Contains(cfg.Scenarios, "check-open") {
		var workloads []resource.Resource
		workloads, checks = loadtest.CheckFlows(set.Flows(cfg.Seed+3, cfg.CheckFlows))
		wrev, err := load(ctx, conns[0], workloads)
		if err != nil {
			return false, fmt.Errorf("load %d workloads: %w", len(workloads), err)
		}
		warm := flows[0]
		warm.MinRevision = wrev
		if _, err := verdictv1.NewDecisionServiceClient(conns[0]).Decide(ctx, warm); err != nil {
			return false, fmt.Errorf("wait for revision %d: %w", wrev, err)
		}
		warm.MinRevision = 0
		fmt.Fprintf(stderr, "loaded %d workloads for %d checks (revision %d)\n", len(workloads), len(checks), wrev)
	}

	var compact []*verdictv1.DecideCompactRequest
	if slices.Contains(cfg.Scenarios, "compact") || slices.Contains(cfg.Scenarios, "compact-stream") {
		var endpoints []*verdictv1.Endpoint
		compact, endpoints = loadtest.CompactBatches(set.Flows(cfg.Seed+1, 8192), cfg.BatchSize)
		if err := loadtest.RegisterIdentities(ctx, conns, resource.DefaultMesh, endpoints); err != nil {
			return false, fmt.Errorf("register %d identities: %w", len(endpoints), err)
		}
		fmt.Fprintf(stderr, "registered %d identities for %d compact batches\n", len(endpoints), len(compact))
	}

	var churn loadtest.WorkloadChurnConfig
	if slices.Contains(cfg.Scenarios, "workload-churn") {
		if churn, err = prepareWorkloadChurn(ctx, cfg, conns, set, stderr); err != nil {
			return false, err
		}
	}

	var base loadtest.Conns
	if needsBaseline(cfg.Scenarios) {
		self, err := os.Executable()
		if err != nil {
			return false, err
		}
		b, err := startProcess(ctx, self, "", stderr, "serve-baseline", "--listen", listenArg(cfg))
		if err != nil {
			return false, fmt.Errorf("start the baseline server: %w", err)
		}
		defer b.stop()
		if base, err = dial(b.addr, cfg.Connections); err != nil {
			return false, err
		}
		defer closeAll(base)
	}
	lim := loadtest.Limits{Duration: cfg.Duration, Requests: cfg.Requests, Warmup: cfg.Warmup}
	var reports []*loadtest.Report
	ok = true
	var sc string // the scenario running
	pair := func(run func(loadtest.Conns) *loadtest.Report) {
		b := run(base)
		b.Target = "baseline"
		v := profiled(sc, func() *loadtest.Report { return run(conns) })
		v.Target = "verdict"
		if b.DecisionsPerSec > 0 {
			v.BaselineDecisionsPerSec, v.Ratio = b.DecisionsPerSec, v.DecisionsPerSec/b.DecisionsPerSec
		}
		reports = append(reports, b, v)
	}
	for _, sc = range cfg.Scenarios {
		if ctx.Err() != nil {
			break
		}
		switch sc {
		case "unary":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Unary(ctx, c, flows, cfg.Concurrency, 0, lim)
			})
		case "open":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Unary(ctx, c, flows, 0, cfg.Rate, lim)
			})
		case "batch":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Batch(ctx, c, flows, max(2, cfg.Concurrency/8), cfg.BatchSize, lim)
			})
		case "stream":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Stream(ctx, c, flows, cfg.Streams, cfg.Window, lim)
			})
		case "compact":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Compact(ctx, c, compact, max(2, cfg.Concurrency/8), lim)
			})
		case "compact-stream":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.CompactStream(ctx, c, compact, cfg.Streams, lim)
			})
		case "check":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Check(ctx, c, checks, cfg.Concurrency, 0, lim)
			})
		case "check-open":
			pair(func(c loadtest.Conns) *loadtest.Report {
				return loadtest.Check(ctx, c, checks, 0, cfg.CheckRate, lim)
			})
		case "churn":
			concurrency := cfg.Concurrency
			if cfg.ChurnRate > 0 {
				concurrency = 0 // open loop: the same in-flight bound as the open scenario
			}
			r := profiled(sc, func() *loadtest.Report {
				return loadtest.Churn(ctx, conns, flows, concurrency, cfg.ChurnRate, cfg.WriteRate,
					resource.DefaultMesh, resource.DefaultType, lim)
			})
			r.Target = "verdict"
			reports = append(reports, r)
		case "workload-churn":
			churn.Limits = lim
			b := loadtest.Unary(ctx, base, churn.Probes, churn.Concurrency, churn.Rate, lim)
			b.Scenario, b.Target = "workload-churn", "baseline"
			v := profiled(sc, func() *loadtest.Report { return loadtest.WorkloadChurn(ctx, conns, churn) })
			v.Target = "verdict"
			if b.DecisionsPerSec > 0 {
				v.BaselineDecisionsPerSec, v.Ratio = b.DecisionsPerSec, v.DecisionsPerSec/b.DecisionsPerSec
			}
			reports = append(reports, b, v)
		case "fanout":
			workloads := make([]resource.Tags, cfg.Workloads)
			for i, f := range set.Flows(cfg.Seed+2, cfg.Workloads) {
				workloads[i] = f.Destination
			}
			r := profiled(sc, func() *loadtest.Report {
				return loadtest.Fanout(ctx, conns, workloads, cfg.Fanout, resource.DefaultMesh, resource.DefaultType,
					cfg.Duration+30*time.Second)
			})
			if r.Count < int64(cfg.Fanout) {
				ok = false
			}
			reports = append(reports, r)
		}
	}
	for _, r := range reports {
		if r.Target == "verdict" && r.ErrorCount() > 0 {
			ok = false
		}
	}
	if cfg.JSON {
		return ok, loadtest.WriteJSON(stdout, reports)
	}
	fmt.Fprintf(stdout, "verdict-loadtest: %d policies, %d connections\n", cfg.Policies, cfg.Connections)
	for _, r := range reports {
		r.WriteText(stdout)
	}
	return ok, ctx.Err()
}

// prepareWorkloadChurn loads the workload-churn scenario's inventory
// (--workloads-loaded workloads over the generated flows' tag sets) and takes
// each probe's answer before the churn, the answer every later one must equal.
func prepareWorkloadChurn(ctx context.Context, cfg Config, conns loadtest.Conns, set *policygen.Set,
	stderr io.Writer) (loadtest.WorkloadChurnConfig, error) {
	workloads, probes := loadtest.ChurnWorkloads(set.Flows(cfg.Seed+4, 4096), cfg.WorkloadsLoaded)
	res := make([]resource.Resource, len(workloads))
	for i, w := range workloads {
		res[i] = w
	}
	start := time.Now()
	rev, err := load(ctx, conns[0], res)
	if err != nil {
		return loadtest.WorkloadChurnConfig{}, fmt.Errorf("load %d workloads: %w", len(workloads), err)
	}
	fmt.Fprintf(stderr, "loaded %d workloads in %v (revision %d)\n", len(workloads), time.Since(start).Round(time.Millisecond), rev)
	expected, err := answers(ctx, conns[0], probes, rev)
	if err != nil {
		return loadtest.WorkloadChurnConfig{}, err
	}
	c := loadtest.WorkloadChurnConfig{Workloads: workloads, Probes: probes, Expected: expected,
		Concurrency: cfg.Concurrency, Rate: cfg.ChurnRate, PutRate: cfg.WorkloadRate, Writers: cfg.WorkloadWriters}
	if c.Rate > 0 {
		c.Concurrency = 0 // open loop: the same in-flight bound as the open scenario
	}
	return c, nil
}

// answers decides every probe at revision rev or later; an end that did not
// resolve to a workload is an error (the inventory is not what was loaded).
func answers(ctx context.Context, conn *grpc.ClientConn, probes []*verdictv1.DecideRequest, rev int64) ([]*verdictv1.DecideResponse, error) {
	client := verdictv1.NewDecisionServiceClient(conn)
	out := make([]*verdictv1.DecideResponse, len(probes))
	for i, p := range probes {
		q := proto.Clone(p).(*verdictv1.DecideRequest)
		q.MinRevision = rev
		r, err := client.Decide(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("decide probe %d at revision %d: %w", i, rev, err)
		}
		if r.GetSourceResolution().GetWorkload() == "" || r.GetDestinationResolution().GetWorkload() == "" {
			return nil, fmt.Errorf("probe %d: an address did not resolve to its workload (%v, %v)", i,
				r.GetSourceResolution(), r.GetDestinationResolution())
		}
		out[i] = r
	}
	return out, nil
}

func needsBaseline(scenarios []string) bool {
	for _, s := range scenarios {
		if s == "unary" || s == "open" || s == "batch" || s == "stream" || s == "check" || s == "check-open" ||
			s == "compact" || s == "compact-stream" || s == "workload-churn" {
			return true
		}
	}
	return false
}

// load writes the resources with Apply, each call one etcd transaction, meshes
// and scopes first; it returns the revision of the last write.
func load(ctx context.Context, conn *grpc.ClientConn, resources []resource.Resource) (int64, error) {
	client := verdictv1.NewPolicyServiceClient(conn)
	var rev int64
	for _, batch := range writeplan.Split(resources, 0) {
		req := &verdictv1.ApplyRequest{}
		for _, r := range batch {
			pr, err := apiconv.ResourceToProto(r)
			if err != nil {
				return 0, err
			}
			req.Resources = append(req.Resources, pr)
		}
		resp, err := client.Apply(ctx, req)
		if err != nil {
			return 0, err
		}
		rev = resp.Revision
	}
	return rev, nil
}

func dial(addr string, n int) (loadtest.Conns, error) {
	conns := make(loadtest.Conns, n)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll(conns[:i])
			return nil, err
		}
		conns[i] = c
	}
	return conns, nil
}

func closeAll(conns loadtest.Conns) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

func waitServing(ctx context.Context, c *grpc.ClientConn) error {
	h := healthpb.NewHealthClient(c)
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := h.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not SERVING (%v, %v)", r.GetStatus(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// process is a child process serving gRPC on a loopback port.
type process struct {
	cmd     *exec.Cmd
	addr    string
	metrics string // its --metrics-listen, a free port in place of 127.0.0.1:0
	dirs    []string
	done    chan error
}

// listenArg is where the started servers listen: a free loopback port, or
// with --unix a Unix socket in a temporary directory.
func listenArg(cfg Config) string {
	if cfg.Unix {
		return "unix:"
	}
	return "127.0.0.1:0"
}

// startProcess runs bin with args; "--listen 127.0.0.1:0" is replaced by a free
// port and "--listen unix:" by a socket in a new temporary directory, an empty
// "--data-dir" by a new temporary directory under tmpParent (the system's
// temporary directory when empty); the directories go when the process stops.
// A child that exits before it listens is started again, twice at most: the
// free port may have been taken between freePort and the child's bind.
func startProcess(ctx context.Context, bin, tmpParent string, stderr io.Writer, args ...string) (*process, error) {
	for attempt := 1; ; attempt++ {
		p, err := startOnce(ctx, bin, tmpParent, stderr, append([]string(nil), args...))
		if err == nil || !errors.Is(err, errExitedEarly) || attempt == 3 || ctx.Err() != nil {
			return p, err
		}
		fmt.Fprintf(stderr, "verdict-loadtest: %v; starting it again\n", err)
	}
}

// errExitedEarly marks a child that exited before it listened.
var errExitedEarly = errors.New("exited before it listened")

func startOnce(ctx context.Context, bin, tmpParent string, stderr io.Writer, args []string) (*process, error) {
	p := &process{done: make(chan error, 1)}
	for i := 0; i+1 < len(args); i++ {
		switch {
		case args[i] == "--listen" && args[i+1] == "127.0.0.1:0":
			ports, err := listen.FreePorts(1)
			if err != nil {
				return nil, err
			}
			p.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
			args[i+1] = p.addr
		case args[i] == "--metrics-listen" && args[i+1] == "127.0.0.1:0":
			ports, err := listen.FreePorts(1)
			if err != nil {
				return nil, err
			}
			args[i+1] = fmt.Sprintf("127.0.0.1:%d", ports[0])
			p.metrics = args[i+1]
		case args[i] == "--metrics-listen":
			p.metrics = args[i+1]
		case args[i] == "--listen" && args[i+1] == "unix:":
			dir, err := os.MkdirTemp("", "verdict-loadtest-sock")
			if err != nil {
				return nil, err
			}
			p.dirs = append(p.dirs, dir)
			p.addr = "unix:" + filepath.Join(dir, "grpc.sock")
			args[i+1] = p.addr
		case args[i] == "--data-dir" && args[i+1] == "":
			dir, err := os.MkdirTemp(tmpParent, "verdict-loadtest")
			if err != nil {
				return nil, err
			}
			p.dirs = append(p.dirs, dir)
			args[i+1] = filepath.Join(dir, "etcd")
		}
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = stderr, stderr
	if err := p.cmd.Start(); err != nil {
		p.cleanup()
		return nil, err
	}
	go func() { p.done <- p.cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		network, addr := "tcp", p.addr
		if path, ok := listen.SocketPath(p.addr); ok {
			network, addr = "unix", path
		}
		c, err := net.DialTimeout(network, addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case err := <-p.done:
			p.cleanup()
			return nil, fmt.Errorf("%s %w: %v", bin, errExitedEarly, err)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.stop()
			return nil, fmt.Errorf("%s does not listen on %s", bin, p.addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *process) stop() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			_ = err // the child's exit status: it was asked to stop
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done //nolint:errcheck // killed: its exit status says nothing more
		}
	}
	p.cleanup()
}

func (p *process) cleanup() {
	for _, dir := range p.dirs {
		os.RemoveAll(dir)
	}
}

// serveBaseline is the hidden subcommand the load tester starts as its ceiling:
// an empty DecisionService with verdictd's gRPC options.
func serveBaseline(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve-baseline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("listen", "127.0.0.1:0", "loopback address, or unix:PATH")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signalContext(ctx)
	defer stop()
	lis, err := listen.Listen(*addr)
	if err != nil {
		fmt.Fprintln(stderr, "serve-baseline:", err)
		return 3
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := loadtest.ServeBaseline(ctx, lis, log); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "serve-baseline:", err)
		return 3
	}
	return 0
}

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// HostileConfig sizes a hostile run: what an attacker with its own gRPC
// clients on loopback can do to one verdictd, while probe Decides measure
// whether honest callers are still served. Zero values take the full sizes
// (`make chaos`); the smoke test in `make test` scales them down.
type HostileConfig struct {
	Verdictd string // the verdictd binary (required)
	Dir      string // as Config.Dir
	// StormStreams: streams opened and cancelled at once, per stream RPC
	// (default 1,000).
	StormStreams int
	// SilentStreams: WatchRules streams that never read, held for SilentFor
	// (default 2,000 for 15 s) while policies change at WriteRate (20/s).
	SilentStreams int
	SilentFor     time.Duration
	WriteRate     float64
	// ReadingStreams: one scenario per size, each that many WatchRules
	// streams that read, of distinct workloads under the 201 policies of
	// the explain flood's mesh, held while policies selecting one of them
	// change at WriteRate for ReadingFor (default 2,000 and 6,000, 10 s).
	ReadingStreams []int
	ReadingFor     time.Duration
	// Oversized DecideBatch bodies (2,097,000 empty flows, ~4 MB) and explain
	// floods (DecideBatch of 1,000 flows with explain on a mesh where 201
	// policies match), each sent Concurrent at a time, Rounds times (default 4 and 3).
	Concurrent, Rounds int
	// ProbeRate Decides per second, each with ProbeTimeout (default 100/s, 100 ms).
	ProbeRate    float64
	ProbeTimeout time.Duration
	// ProbeCommand runs the probes in a process of their own: the command
	// and its arguments, to which the probe's flags are added (--addr,
	// --rate, --timeout); it runs RunProbe until its input ends (verdict-chaos
	// re-executes itself: `verdict-chaos probe`). Empty: the probes run in
	// this process, beside the attackers, whose work then delays them too.
	ProbeCommand []string
	// ProfileDir, when set, receives CPU profiles of verdictd while each
	// scenario runs, in slices of ProfileFor (default 2 s), one file a slice.
	ProfileDir string
	ProfileFor time.Duration
	// IdentifyFor: how long the identity flood's attacker, on IdentifyConns
	// connections of one caller, registers fresh tag sets (default 10 s, 2
	// connections; negative: the scenario is skipped).
	IdentifyFor   time.Duration
	IdentifyConns int
	// LogFloodFor: how long the decision-log flood lasts (default 10 s;
	// negative: skipped, and verdictd runs without a decision log). For the
	// run verdictd logs every decision to a file in Dir rotated at
	// LogMaxSize, LogMaxFiles files in all (default 8 MiB and 3).
	LogFloodFor time.Duration
	LogMaxSize  int64
	LogMaxFiles int
	// Settle: how long after each scenario the goroutines and heap may take
	// to come back to the baseline (default 30 s).
	Settle time.Duration
	Logger *slog.Logger
}

func (c HostileConfig) withDefaults() HostileConfig {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.StormStreams, 1000)
	def(&c.SilentStreams, 2000)
	def(&c.Concurrent, 4)
	def(&c.Rounds, 3)
	if c.SilentFor <= 0 {
		c.SilentFor = 15 * time.Second
	}
	if len(c.ReadingStreams) == 0 {
		c.ReadingStreams = []int{2000, 6000}
	}
	if c.ReadingFor <= 0 {
		c.ReadingFor = 10 * time.Second
	}
	if c.WriteRate <= 0 {
		c.WriteRate = 20
	}
	if c.ProbeRate <= 0 {
		c.ProbeRate = 100
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 100 * time.Millisecond
	}
	if c.Settle <= 0 {
		c.Settle = 30 * time.Second
	}
	if c.ProfileFor <= 0 {
		c.ProfileFor = 2 * time.Second
	}
	if c.IdentifyFor == 0 {
		c.IdentifyFor = 10 * time.Second
	}
	def(&c.IdentifyConns, 2)
	if c.LogFloodFor == 0 {
		c.LogFloodFor = 10 * time.Second
	}
	if c.LogMaxSize <= 0 {
		c.LogMaxSize = 8 << 20
	}
	def(&c.LogMaxFiles, 3)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// HostileReport is a hostile run's result. Problems break a promise whatever
// the load (a goroutine leak, a scenario answered with the wrong code, an
// honest watcher that lost an update); Misses are the targets that depend on
// the machine's load (probe Decides past their deadline, the honest watcher's
// lag over 1 s, the heap not back within ±10% in time).
type HostileReport struct {
	Baseline  Sample            `json:"baseline"`
	Scenarios []HostileScenario `json:"scenarios"`
	Probes    ReplicaReport     `json:"probes"`
	Pass      bool              `json:"pass"`
	Problems  []string          `json:"problems,omitempty"`
	Misses    []string          `json:"misses,omitempty"`
	config    HostileConfig     // for the text report
}

// HostileScenario is one scenario's outcome.
type HostileScenario struct {
	Name     string           `json:"name"`
	Duration time.Duration    `json:"duration"`
	Codes    map[string]int64 `json:"codes"`  // how the attacker's calls and streams ended
	Before   Sample           `json:"before"` // the server before the attack
	Peak     Sample           `json:"peak"`   // the server at the end of the attack
	After    Sample           `json:"after"`  // once settled (or at the end of Settle)
	Settled  time.Duration    `json:"settled"`
	// Keeps: live heap the scenario may leave by design, over the ±10%
	// (the Identify flood: the registry's share of one mesh, 16 MiB).
	Keeps int64 `json:"keepsBytes,omitempty"`
	// the honest watcher (silent-streams scenario only)
	Updates    int           `json:"updates,omitempty"`
	Missed     int           `json:"missedUpdates,omitempty"`
	LagP99     time.Duration `json:"lagP99,omitempty"`
	LagMax     time.Duration `json:"lagMax,omitempty"`
	AnswerSize int           `json:"largestAnswerBytes,omitempty"`
	// the reading streams: their live heap each, and verdictd's CPU per
	// write while they were attached
	Streams       int           `json:"streams,omitempty"`
	HeapPerStream int64         `json:"heapPerStreamBytes,omitempty"`
	Writes        int           `json:"writes,omitempty"`
	CPUPerWrite   time.Duration `json:"cpuPerWrite,omitempty"`
	// the floods' own figures
	Identify *IdentifyFlood `json:"identifyFlood,omitempty"`
	Log      *LogFlood      `json:"decisionLogFlood,omitempty"`
	// ProbesFailed: probe Decides sent during the scenario (the attack and
	// its settling) that failed, timed out included.
	ProbesFailed int64 `json:"probesFailed"`
}

// hostileMesh holds the policies of the explain flood: 201 of them match
// every flow of the flood.
const hostileMesh = "hostile"

// Hostile starts one etcd member and one verdictd, then runs each scenario in
// turn with probe Decides going all along.
func Hostile(ctx context.Context, cfg HostileConfig) (*HostileReport, error) {
	if cfg.Verdictd == "" {
		return nil, errors.New("chaos: Verdictd (the binary) is required")
	}
	cfg = cfg.withDefaults()
	dir, cleanup, err := makeDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cfg.Logger.Info("starting etcd and verdictd", "dir", dir)
	var extra []string
	logPath := filepath.Join(dir, "decisions.log")
	if cfg.LogFloodFor > 0 {
		extra = logFloodArgs(logPath, cfg.LogMaxSize, cfg.LogMaxFiles)
	}
	e, err := newEnv(ctx, dir, cfg.Verdictd, 1, 1, extra...)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if _, err := seed(ctx, e); err != nil {
		return nil, err
	}
	r := e.replicas[0]
	if err := seedHostile(ctx, r.current()); err != nil {
		return nil, err
	}
	if err := seedFloods(ctx, r.current()); err != nil {
		return nil, err
	}
	rep := &HostileReport{config: cfg}
	sleepCtx(ctx, 2*time.Second)
	if rep.Baseline, err = scrapeLive(ctx, r.metrics); err != nil {
		return nil, err
	}

	var ph phases
	ph.set("probes")
	probeCtx, stopProbes := context.WithCancel(ctx)
	obs := newObserver(e.replicas, ph.current)
	dec := newDeciders(e.replicas, flows(), cfg.ProbeRate, cfg.ProbeTimeout, obs, ph.current)
	var wg sync.WaitGroup
	var probes *probeProcess
	if len(cfg.ProbeCommand) > 0 {
		probes, err = startProbeProcess(cfg.ProbeCommand, ProbeConfig{Addr: r.addr, Rate: cfg.ProbeRate, Timeout: cfg.ProbeTimeout},
			dec.stats[0], &ph, time.Now())
		if err != nil {
			stopProbes()
			return nil, err
		}
	} else {
		wg.Go(func() { dec.run(probeCtx, time.Now()) })
	}

	h := &hostile{cfg: cfg, env: e, r: r, logPath: logPath}
	type scenario struct {
		name string
		run  func(context.Context, *HostileScenario) error
	}
	scenarios := []scenario{
		{"DecideStream cancel storm", h.stormDecideStream},
		{"WatchRules cancel storm", h.stormWatchRules},
		{"WatchResources cancel storm", h.stormWatchResources},
		{"non-reading WatchRules streams under writes", h.silentStreams},
	}
	for _, n := range cfg.ReadingStreams {
		scenarios = append(scenarios, scenario{fmt.Sprintf("%d reading WatchRules streams of distinct workloads under writes", n),
			func(ctx context.Context, s *HostileScenario) error { return h.readingStreams(ctx, s, n) }})
	}
	scenarios = append(scenarios, scenario{"oversized DecideBatch bodies", h.oversized}, scenario{"explain floods", h.explainFlood})
	if cfg.IdentifyFor > 0 {
		scenarios = append(scenarios, scenario{"Identify flood of fresh tag sets", h.identifyFlood})
	}
	if cfg.LogFloodFor > 0 {
		scenarios = append(scenarios, scenario{"decision-log flood", h.logFlood})
	}
	for _, sc := range scenarios {
		if ctx.Err() != nil {
			break
		}
		ph.set(sc.name)
		cfg.Logger.Info("scenario", "name", sc.name)
		s := HostileScenario{Name: sc.name, Codes: map[string]int64{}}
		s.Before, _ = scrapeLive(ctx, r.metrics)
		start := time.Now()
		profiled := make(chan struct{})
		if cfg.ProfileDir != "" {
			i := len(rep.Scenarios)
			wg.Go(func() { h.profile(ctx, i, sc.name, profiled) })
		}
		if err := sc.run(ctx, &s); err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %v", sc.name, err))
		}
		close(profiled)
		s.Duration = time.Since(start).Round(time.Millisecond)
		if s.Peak == (Sample{}) { // unless the scenario read it when its attack ended
			s.Peak, _ = scrapeLive(ctx, r.metrics)
		}
		h.settle(ctx, s.Before, &s)
		rep.Scenarios = append(rep.Scenarios, s)
	}
	stopProbes()
	wg.Wait()
	if probes != nil {
		if err := probes.stop(); err != nil {
			rep.Problems = append(rep.Problems, err.Error())
		}
	}
	st := dec.stats[0]
	for i := range st.failures {
		st.failures[i].Replica = r.name
	}
	st.mu.Lock()
	rep.Probes = ReplicaReport{Name: r.name, Sent: st.sent, OK: st.ok, FailedLiveBy: st.liveFailed, Latency: summarize(&st.latency),
		Failures: st.failures, Skipped: st.skipped}
	for i := range rep.Scenarios {
		rep.Scenarios[i].ProbesFailed = st.failedInPhase[rep.Scenarios[i].Name]
	}
	st.mu.Unlock()
	for _, n := range rep.Probes.FailedLiveBy {
		rep.Probes.FailedLive += n
	}
	rep.judge()
	return rep, nil
}

type hostile struct {
	cfg     HostileConfig
	env     *env
	r       *replica
	logPath string // the decision log's file (with LogFloodFor > 0)
}

// seedHostile writes the explain flood's mesh: 201 ALLOW policies that all
// match its flows.
func seedHostile(ctx context.Context, c *clients) error {
	var res []*verdictv1.Resource
	for i := range 201 {
		p := &resource.Policy{Mesh: hostileMesh, Type: resource.DefaultType, Name: fmt.Sprintf("p-%03d", i), Action: resource.Allow,
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: "*"}}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: "*"}}}}
		pr, err := apiconv.ResourceToProto(p)
		if err != nil {
			return err
		}
		res = append(res, pr)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(res) > 0 {
		n := min(len(res), 100) // under the 128 writes of one call
		if _, err := c.pol.Apply(cctx, &verdictv1.ApplyRequest{Resources: res[:n]}); err != nil {
			return err
		}
		res = res[n:]
	}
	return nil
}

// scrapeLive asks verdictd for a heap profile with ?gc=1 (net/http/pprof on
// its loopback metrics listener), which runs a GC, then scrapes: the live heap
// it reads is the heap now. /metrics alone gives the heap marked live by the
// last GC, and an idle daemon may run none for 2 minutes: a figure from before
// the attack ended would look like retention.
func scrapeLive(ctx context.Context, addr string) (Sample, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("GET /debug/pprof/heap?gc=1: %s (verdictd serves it on a loopback --metrics-listen only)", resp.Status)
	}
	return scrape(ctx, addr)
}

// settle waits until the server's goroutines are back within 10% (+10) of
// what they were before the scenario and its live heap within 10% (+4 MiB: one GC cycle's noise,
// and what the scenario keeps by design), at most Settle.
func (h *hostile) settle(ctx context.Context, base Sample, s *HostileScenario) {
	start := time.Now()
	for {
		smp, err := scrapeLive(ctx, h.r.metrics)
		if err == nil {
			s.After = smp
			if smp.Goroutines <= base.Goroutines*11/10+idleSlack && smp.HeapLive <= base.HeapLive*11/10+4<<20+s.Keeps {
				s.Settled = time.Since(start).Round(100 * time.Millisecond)
				return
			}
		}
		if time.Since(start) > h.cfg.Settle || ctx.Err() != nil {
			s.Settled = -1
			return
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

func (h *hostile) dial() (*clients, error) { return dialClients(h.r.addr) }

// profile writes CPU profiles of verdictd while scenario i runs (until
// done is closed) to ProfileDir, in slices of ProfileFor (net/http/pprof on
// its metrics listener; one profile at a time: a slice waits for the one of
// the scenario before, which ends at most ProfileFor into this one).
// `go tool pprof` reads the slices of a scenario together.
func (h *hostile) profile(ctx context.Context, i int, name string, done <-chan struct{}) {
	secs := max(1, int(h.cfg.ProfileFor.Seconds()))
	slug := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	for k := 0; ctx.Err() == nil; {
		select {
		case <-done:
			return
		default:
		}
		b, code, err := h.cpuProfile(ctx, secs)
		switch {
		case err != nil:
			h.cfg.Logger.Warn("CPU profile", "scenario", name, "error", err)
			return
		case code == http.StatusInternalServerError: // the one before still runs
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		case code != http.StatusOK:
			h.cfg.Logger.Warn("CPU profile", "scenario", name, "status", code)
			return
		}
		if err := os.WriteFile(filepath.Join(h.cfg.ProfileDir, fmt.Sprintf("%02d-%s-%d.pprof", i, slug, k)), b, 0o644); err != nil {
			h.cfg.Logger.Warn("CPU profile", "scenario", name, "error", err)
			return
		}
		k++
	}
}

// cpuProfile is a CPU profile of verdictd over secs seconds, and the HTTP
// status it came with.
func (h *hostile) cpuProfile(ctx context.Context, secs int) ([]byte, int, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs+20)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", h.r.metrics, secs), nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, err
}

func count(mu *sync.Mutex, m map[string]int64, err error) {
	k := codeOf(err)
	mu.Lock()
	m[k]++
	mu.Unlock()
}

// codeOf is the gRPC code a call ended with: OK, Canceled, ….
func codeOf(err error) string {
	switch {
	case err == nil:
		return codes.OK.String()
	case errors.Is(err, context.Canceled):
		return codes.Canceled.String()
	}
	return status.Code(err).String()
}

// storm opens n streams at most 64 at a time on one connection of its own;
// each runs open with a context it then cancels.
func (h *hostile) storm(ctx context.Context, s *HostileScenario, open func(context.Context, *clients, int) error) error {
	c, err := h.dial()
	if err != nil {
		return err
	}
	defer c.conn.Close()
	var mu sync.Mutex
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range h.cfg.StormStreams {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := open(sctx, c, i)
			cancel()
			count(&mu, s.Codes, err)
		})
	}
	wg.Wait()
	return nil
}

// stormDecideStream: send one message, cancel without reading.
func (h *hostile) stormDecideStream(ctx context.Context, s *HostileScenario) error {
	fl := flows()
	return h.storm(ctx, s, func(ctx context.Context, c *clients, i int) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := c.dec.DecideStream(ctx)
		if err != nil {
			return err
		}
		f := fl[i%len(fl)]
		if err := st.Send(&verdictv1.DecideStreamRequest{Id: fmt.Sprint(i), Request: f}); err != nil {
			return err
		}
		return context.Canceled
	})
}

// stormWatchRules: open, read the first message on every other stream, cancel.
func (h *hostile) stormWatchRules(ctx context.Context, s *HostileScenario) error {
	return h.storm(ctx, s, func(ctx context.Context, c *clients, i int) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := c.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{
			Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-%d", i%50)}}})
		if err != nil {
			return err
		}
		if i%2 == 0 {
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
		return context.Canceled
	})
}

// stormWatchResources: open (snapshot requested), cancel at once or after the
// first message.
func (h *hostile) stormWatchResources(ctx context.Context, s *HostileScenario) error {
	return h.storm(ctx, s, func(ctx context.Context, c *clients, i int) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := c.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
		if err != nil {
			return err
		}
		if i%2 == 0 {
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
		return context.Canceled
	})
}

// hostileWorkload is the workload every silent stream watches; the writes
// of the scenario all change its inbound rules.
var hostileWorkload = map[string]string{resource.ServiceTag: "hostile-target"}

// silentStreams holds SilentStreams WatchRules streams that never read while
// policies concerning their workload change at WriteRate; an honest watcher
// on its own connection measures how late it learns of each write. At the
// end the silent streams are read to see how the server ended them.
func (h *hostile) silentStreams(ctx context.Context, s *HostileScenario) error {
	// HTTP/2 flow control as a client that does not read gets it: fixed
	// 64 KiB windows. gRPC's default (a window grown from bandwidth-delay
	// estimates, up to 16 MiB per stream) would have this process's
	// transport read and buffer everything for the streams, which measures
	// this process's heap, not the server's handling of a client that stops.
	// The silent streams come from agents of their own: callerStreams a
	// connection, each from its own loopback address (the server caps
	// streams per connection and per caller).
	silent, err := h.callers((h.cfg.SilentStreams+callerStreams-1)/callerStreams,
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		return err
	}
	defer closeAll(silent)
	honest, err := h.dial()
	if err != nil {
		return err
	}
	defer honest.conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{Tags: hostileWorkload}}
	streams := make([]grpc.ServerStreamingClient[verdictv1.WatchRulesResponse], 0, h.cfg.SilentStreams)
	for i := range h.cfg.SilentStreams {
		st, err := silent[i/callerStreams].wat.WatchRules(sctx, req)
		if err != nil {
			return fmt.Errorf("open a silent stream: %w", err)
		}
		streams = append(streams, st)
	}
	watch, err := honest.wat.WatchRules(sctx, req)
	if err != nil {
		return err
	}
	// The honest watcher: the revision of every message it gets, and when.
	var (
		mu    sync.Mutex
		got   []revAt
		wdone = make(chan error, 1)
	)
	go func() {
		for {
			m, err := watch.Recv()
			if err != nil {
				wdone <- err
				return
			}
			mu.Lock()
			got = append(got, revAt{m.GetRevision(), time.Now()})
			if n := proto.Size(m); n > s.AnswerSize {
				s.AnswerSize = n
			}
			mu.Unlock()
		}
	}()
	// The writes: each flips one of 20 policies whose destination is the
	// watched workload, so every write changes its inbound rules.
	var writes []revAt
	tick := time.NewTicker(time.Duration(float64(time.Second) / h.cfg.WriteRate))
	end := time.After(h.cfg.SilentFor)
	c := h.r.current()
writing:
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			break writing
		case <-end:
			break writing
		case <-tick.C:
		}
		p := &resource.Policy{Mesh: resource.DefaultMesh, Type: resource.DefaultType, Name: fmt.Sprintf("hostile-%d", n%20),
			Action:       []resource.Action{resource.Allow, resource.Deny}[(n/20)%2],
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("peer-%d", n%20)}}},
			Destinations: []resource.Selector{{Match: hostileWorkload}}}
		pr, err := apiconv.ResourceToProto(p)
		if err != nil {
			return err
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.pol.Apply(wctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{pr}})
		wcancel()
		if err != nil {
			s.Codes["write "+status.Code(err).String()]++
			continue
		}
		writes = append(writes, revAt{resp.GetRevision(), time.Now()})
	}
	tick.Stop()
	// Wait for the honest watcher to see the last write (a busy machine
	// delays it; one that never comes counts as missed after 30 s).
	awaitSeen(ctx, &mu, &got, writes, 30*time.Second)
	mu.Lock()
	var lags []time.Duration
	for _, w := range writes {
		i := sort.Search(len(got), func(i int) bool { return got[i].rev >= w.rev })
		if i == len(got) {
			s.Missed++
			continue
		}
		lags = append(lags, max(0, got[i].at.Sub(w.at)))
	}
	s.Updates = len(got)
	mu.Unlock()
	s.LagP99, s.LagMax = lagFigures(lags)
	// How the server ended the silent streams: read each until its end or
	// until 2 s pass for all of them together.
	var cmu sync.Mutex
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	var wg sync.WaitGroup
	for _, st := range streams {
		wg.Go(func() {
			for {
				if _, err := st.Recv(); err != nil {
					if rctx.Err() != nil && status.Code(err) == codes.Canceled {
						err = errors.New("still open")
					}
					k := status.Code(err).String()
					if err.Error() == "still open" {
						k = "still open"
					}
					cmu.Lock()
					s.Codes["silent "+k]++
					cmu.Unlock()
					return
				}
			}
		})
	}
	go func() { <-rctx.Done(); cancel() }()
	wg.Wait()
	rcancel()
	// The honest watcher's stream ends with the scenario's context: that
	// cancellation is expected; anything else is a finding.
	if err := <-wdone; status.Code(err) != codes.Canceled {
		return fmt.Errorf("the honest watcher's stream ended with %w", err)
	}
	return nil
}

// lagFigures are the p99 and the maximum of lags.
func lagFigures(lags []time.Duration) (p99, most time.Duration) {
	if len(lags) == 0 {
		return 0, 0
	}
	slices.Sort(lags)
	return lags[(len(lags)*99)/100-min(1, (len(lags)*99)/100)], lags[len(lags)-1]
}

// callerStreams is how many WatchRules streams one attacking agent opens on
// its connection: under verdictd's caps per connection (1,000) and per
// caller (4,000).
const callerStreams = 500

// callers dials n connections, connection i from the loopback address
// 127.0.0.(2+i) where the system has it (Linux: all of 127/8; elsewhere the
// default address), so that verdictd sees n callers, as it sees n agents.
func (h *hostile) callers(n int, opts ...grpc.DialOption) ([]*clients, error) {
	out := make([]*clients, 0, n)
	for i := range n {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%250))}
		dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{LocalAddr: local}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			}
			return c, nil
		})
		c, err := dialClients(h.r.addr, append([]grpc.DialOption{dial}, opts...)...)
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func closeAll(cs []*clients) {
	for _, c := range cs {
		c.conn.Close()
	}
}

// readingStreams holds n WatchRules streams that read, each of a workload
// of its own under the 201 policies of the explain flood's mesh (every
// workload's lists hold all 201), spread over agents of callerStreams
// streams each: the live heap they hold, per stream. Then a policy selecting
// one of the workloads changes at WriteRate for ReadingFor: verdictd's CPU
// per write (a write computes again only the lists it can change), and how
// late that workload's stream learns of each write.
func (h *hostile) readingStreams(ctx context.Context, s *HostileScenario, n int) error {
	conns, err := h.callers((n + callerStreams - 1) / callerStreams)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const watched = 7 // the workload the writes select
	var (
		mu          sync.Mutex
		got         []revAt
		opened      sync.WaitGroup
		wg          sync.WaitGroup
		sem         = make(chan struct{}, 64)
		started     atomic.Int64
		watchedOpen atomic.Bool
	)
	for i := range n {
		opened.Add(1)
		wg.Go(func() {
			first := true
			done := func() {
				if first {
					first = false
					opened.Done()
				}
			}
			defer done()
			sem <- struct{}{}
			st, err := conns[i/callerStreams].wat.WatchRules(sctx, &verdictv1.WatchRulesRequest{Mesh: hostileMesh,
				Workload: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("reading-%d", i)}}})
			for err == nil {
				var m *verdictv1.WatchRulesResponse
				if m, err = st.Recv(); err != nil {
					break
				}
				if first {
					started.Add(1)
					watchedOpen.CompareAndSwap(false, i == watched)
					<-sem
					done()
					continue
				}
				if i == watched {
					mu.Lock()
					got = append(got, revAt{m.GetRevision(), time.Now()})
					mu.Unlock()
				}
			}
			if first { // refused: a cap, or worse
				<-sem
				mu.Lock()
				s.Codes["refused "+status.Code(err).String()]++
				mu.Unlock()
				return
			}
			count(&mu, s.Codes, err)
		})
	}
	opened.Wait()
	s.Streams = int(started.Load())
	if held, err := scrapeLive(ctx, h.r.metrics); err == nil && s.Streams > 0 {
		s.HeapPerStream = (held.HeapLive - s.Before.HeapLive) / int64(s.Streams)
	}
	cpu0, err := cpuSeconds(ctx, h.r.metrics)
	if err != nil {
		return err
	}
	var writes []revAt
	tick := time.NewTicker(time.Duration(float64(time.Second) / h.cfg.WriteRate))
	defer tick.Stop()
	end := time.After(h.cfg.ReadingFor)
	c := h.r.current()
writing:
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			break writing
		case <-end:
			break writing
		case <-tick.C:
		}
		p := &resource.Policy{Mesh: hostileMesh, Type: resource.DefaultType, Name: "reading-write",
			Action:       []resource.Action{resource.Allow, resource.Deny}[k%2],
			Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: "peer"}}},
			Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("reading-%d", watched)}}}}
		pr, err := apiconv.ResourceToProto(p)
		if err != nil {
			return err
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.pol.Apply(wctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{pr}})
		wcancel()
		if err != nil {
			s.Codes["write "+status.Code(err).String()]++
			continue
		}
		writes = append(writes, revAt{resp.GetRevision(), time.Now()})
	}
	awaitSeen(ctx, &mu, &got, writes, 30*time.Second) // the last write's update
	cpu1, err := cpuSeconds(ctx, h.r.metrics)
	if err != nil {
		return err
	}
	s.Writes = len(writes)
	if len(writes) > 0 {
		s.CPUPerWrite = time.Duration((cpu1 - cpu0) / float64(len(writes)) * float64(time.Second))
	}
	mu.Lock()
	var lags []time.Duration
	for _, w := range writes {
		i := sort.Search(len(got), func(i int) bool { return got[i].rev >= w.rev })
		if i == len(got) {
			if watchedOpen.Load() {
				s.Missed++
			}
			continue
		}
		lags = append(lags, max(0, got[i].at.Sub(w.at)))
	}
	s.Updates = len(got)
	mu.Unlock()
	s.LagP99, s.LagMax = lagFigures(lags)
	cancel()
	wg.Wait()
	return nil
}

// cpuSeconds is verdictd's process_cpu_seconds_total.
func cpuSeconds(ctx context.Context, addr string) (float64, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("metrics at %s: no process_cpu_seconds_total", addr)
}

// oversized sends DecideBatch bodies of 2,097,000 empty flows (~4 MB, just
// under the message limit), Concurrent at a time, Rounds times.
func (h *hostile) oversized(ctx context.Context, s *HostileScenario) error {
	// Field 1 (requests), length 0, 2,097,000 times: what proto.Marshal makes
	// of that many empty DecideRequests, without building them.
	body := bytes.Repeat([]byte{0x0a, 0x00}, 2_097_000)
	return h.flood(ctx, s, func(ctx context.Context, c *clients) error {
		return c.conn.Invoke(ctx, verdictv1.DecisionService_DecideBatch_FullMethodName, rawMessage(body),
			new(verdictv1.DecideBatchResponse), grpc.ForceCodecV2(rawCodec{}))
	})
}

// explainFlood sends DecideBatch calls of 1,000 flows with explain on the
// mesh where 201 policies match every flow.
func (h *hostile) explainFlood(ctx context.Context, s *HostileScenario) error {
	req := &verdictv1.DecideBatchRequest{}
	for i := range 1000 {
		req.Requests = append(req.Requests, &verdictv1.DecideRequest{Mesh: hostileMesh, Explain: true,
			Source:      &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("src-%d", i)}},
			Destination: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("dst-%d", i%10)}}})
	}
	var mu sync.Mutex
	return h.flood(ctx, s, func(ctx context.Context, c *clients) error {
		resp, err := c.dec.DecideBatch(ctx, req, grpc.MaxCallRecvMsgSize(256<<20))
		if err == nil {
			n := proto.Size(resp)
			mu.Lock()
			s.AnswerSize = max(s.AnswerSize, n)
			mu.Unlock()
		}
		return err
	})
}

// flood runs call Concurrent at a time, Rounds times, each on a connection
// of its own, with a 30 s deadline each.
func (h *hostile) flood(ctx context.Context, s *HostileScenario, call func(context.Context, *clients) error) error {
	var mu sync.Mutex
	for range h.cfg.Rounds {
		var wg sync.WaitGroup
		for range h.cfg.Concurrent {
			c, err := h.dial()
			if err != nil {
				return err
			}
			wg.Go(func() {
				defer c.conn.Close()
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				count(&mu, s.Codes, call(cctx, c))
			})
		}
		wg.Wait()
	}
	return nil
}

// rawMessage is a request body already encoded: rawCodec sends its bytes as
// they are (marshalling 2M messages once, not once per call).
type rawMessage []byte

// rawCodec is gRPC's proto codec, but for rawMessage requests.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

// judge sorts the findings into problems and misses.
func (rep *HostileReport) judge() {
	for _, s := range rep.Scenarios {
		if s.Settled < 0 {
			if s.After.Goroutines > s.Before.Goroutines*11/10+idleSlack {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d goroutines %v after, %d before: a leak", s.Name,
					s.After.Goroutines, rep.config.Settle, s.Before.Goroutines))
			} else {
				rep.Misses = append(rep.Misses, fmt.Sprintf("%s: live heap %s %v after, %s before (%s kept by design)", s.Name, mib(s.After.HeapLive),
					rep.config.Settle, mib(s.Before.HeapLive), mib(s.Keeps)))
			}
		}
		if s.ProbesFailed > 0 {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %d probe Decides failed during it or its settling", s.Name, s.ProbesFailed))
		}
		if s.Missed > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the honest watcher never saw %d writes", s.Name, s.Missed))
		}
		if s.LagP99 > time.Second {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: the honest watcher's lag p99 %s (target ≤ 1 s)", s.Name, ms(s.LagP99)))
		}
		if s.HeapPerStream > 64<<10 {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %s of live heap per stream (target ≤ 64 KiB)", s.Name, mib(s.HeapPerStream)))
		}
		for k, n := range s.Codes {
			if strings.HasPrefix(k, "write ") {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d writes failed: %s", s.Name, n, k))
			}
			if c := k[strings.LastIndexByte(k, ' ')+1:]; c == codes.Internal.String() || c == codes.Unknown.String() {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d calls answered %s", s.Name, n, k))
			}
		}
		if s.Identify != nil {
			rep.judgeIdentify(s.Name, s.Identify)
		}
		if s.Log != nil {
			rep.judgeLog(s.Name, s.Log)
		}
	}
	timedOut := rep.Probes.FailedLiveBy[codes.DeadlineExceeded.String()]
	if n := rep.Probes.FailedLive - timedOut; n > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d probe Decides failed with an error", n))
	}
	if timedOut > 0 {
		rep.Misses = append(rep.Misses, fmt.Sprintf("%d probe Decides ran out of their %v deadline (target 0)", timedOut, rep.config.ProbeTimeout))
	}
	rep.Pass = len(rep.Problems) == 0 && len(rep.Misses) == 0
}

// verdictd's default quota of sets per mesh in the registry, and of their
// bytes (docs/api.md, Identify).
const (
	identityMeshMaxSets  = 16384
	identityMeshMaxBytes = 16 << 20
)

// judgeIdentify: an identity answered for another set, or a victim's set of
// mesh B evicted by mesh A's flood, or mesh A over its quota, is a problem;
// the victim's calls past their deadline are misses.
func (rep *HostileReport) judgeIdentify(name string, f *IdentifyFlood) {
	if f.Mismatches > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d identity answers differ from the tag answer of the same flow: %s",
			name, f.Mismatches, strings.Join(f.MismatchFirst, "; ")))
	}
	if f.Unknown > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d of the victim's identity answers in mesh %s were unknown: mesh %s's flood evicted them",
			name, f.Unknown, floodMeshB, floodMeshA))
	}
	if f.Held > identityMeshMaxSets {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: mesh %s holds %d registered sets, over its quota of %d",
			name, floodMeshA, f.Held, identityMeshMaxSets))
	}
	for k, n := range f.VictimFailed {
		if strings.HasSuffix(k, " "+codes.DeadlineExceeded.String()) {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %d of the victim's calls ran out of their deadline: %s", name, n, k))
		} else {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d of the victim's calls failed: %s", name, n, k))
		}
	}
}

// judgeLog: files over their cap, lines over the record cap, sink errors,
// or an honest decision neither written nor told dropped, are problems; an
// accounting the reader could not complete (it missed a file) and honest
// calls that failed are misses.
func (rep *HostileReport) judgeLog(name string, f *LogFlood) {
	if f.MaxBytes > f.Bound {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the log's files held %d bytes, over max-size × max-files + one record (%d)",
			name, f.MaxBytes, f.Bound))
	}
	if f.Overlong > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d lines over the record cap of %d bytes", name, f.Overlong, f.MaxRecord))
	}
	if f.SinkErrs > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d batches the file sink failed to write", name, f.SinkErrs))
	}
	switch {
	case f.Accounted:
	case f.Verifiable:
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the honest flow decided %d times, %d written and %d told dropped",
			name, f.HonestDecided, f.HonestWritten, f.HonestTold))
	default:
		rep.Misses = append(rep.Misses, fmt.Sprintf("%s: the honest flow's accounting not verified (%d files rotated away unread, follower: %q)",
			name, f.Unread, f.FollowErr))
	}
	if f.Verifiable && f.HonestInFile != f.HonestWritten {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the file holds %d of the honest flow's decisions, Follow saw %d written",
			name, f.HonestInFile, f.HonestWritten))
	}
	if f.HonestFailed > 0 {
		rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %d of the honest flow's Decides failed", name, f.HonestFailed))
	}
}

// WriteJSON writes the report as indented JSON.
func (rep *HostileReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText prints the report for people.
func (rep *HostileReport) WriteText(w io.Writer) {
	c := rep.config
	fmt.Fprintf(w, "verdict-chaos hostile: one verdictd; probe Decides %.0f/s with a %v deadline all along\n", c.ProbeRate, c.ProbeTimeout)
	fmt.Fprintf(w, "  baseline: %d goroutines, heap live %s, RSS %s\n\n", rep.Baseline.Goroutines, mib(rep.Baseline.HeapLive), mib(rep.Baseline.RSS))
	for _, s := range rep.Scenarios {
		fmt.Fprintf(w, "%s (%s)\n", s.Name, ms(s.Duration))
		fmt.Fprintf(w, "  attacker's calls and streams ended: %s\n", fmtCodes(s.Codes))
		fmt.Fprintf(w, "  at the end of the attack: %d goroutines, heap live %s, RSS %s\n", s.Peak.Goroutines, mib(s.Peak.HeapLive), mib(s.Peak.RSS))
		if s.Keeps > 0 {
			fmt.Fprintf(w, "  kept by design: up to %s of live heap\n", mib(s.Keeps))
		}
		settled := "not within " + c.Settle.String()
		if s.Settled >= 0 {
			settled = "after " + s.Settled.String()
		}
		fmt.Fprintf(w, "  back to where it was before (%d goroutines, heap live %s; ±10%%): %s — %d goroutines, heap live %s\n",
			s.Before.Goroutines, mib(s.Before.HeapLive), settled, s.After.Goroutines, mib(s.After.HeapLive))
		if s.Updates > 0 || s.Missed > 0 {
			fmt.Fprintf(w, "  honest watcher: %d messages, %d writes never seen, lag p99 %s max %s (target p99 ≤ 1 s)\n", s.Updates, s.Missed, ms(s.LagP99), ms(s.LagMax))
		}
		if s.AnswerSize > 0 {
			fmt.Fprintf(w, "  largest answer: %d bytes\n", s.AnswerSize)
		}
		if s.Streams > 0 {
			fmt.Fprintf(w, "  %d streams open: %.1f KiB of live heap each (target ≤ 64 KiB); %d writes, %s of verdictd CPU each\n",
				s.Streams, float64(s.HeapPerStream)/1024, s.Writes, s.CPUPerWrite.Round(10*time.Microsecond))
		}
		if f := s.Identify; f != nil {
			fmt.Fprintf(w, "  attacker's endpoints: %s; %d sets registered in mesh %s, %d held after, %d evicted\n",
				fmtCodes(f.Endpoints), f.Registered, floodMeshA, f.Held, f.Evicted)
			fmt.Fprintf(w, "  live heap right after the flood, per set held: %d bytes (the registry keeps its sets)\n", f.HeapPerSet)
			fmt.Fprintf(w, "  victim: %d rounds, %d identity answers compared with tags, %d differed (target 0); unknown: %d in mesh %s (target 0), %d in mesh %s (evicted: Identify again %d times); failed: %s\n",
				f.VictimRounds, f.Compared, f.Mismatches, f.Unknown, floodMeshB, f.UnknownA, floodMeshA, f.Reidentified, fmtCodes(f.VictimFailed))
		}
		if f := s.Log; f != nil {
			fmt.Fprintf(w, "  log files: at most %s together (bound %s: %s × %d + one record); by second: %s\n",
				mib(f.MaxBytes), mib(f.Bound), mib(f.MaxSize), f.MaxFiles, fmtSizes(f.BytesBySecond))
			fmt.Fprintf(w, "  records: %d offered, %d written, %d repeats, %d truncated, dropped by mesh: %s; sink errors %d\n",
				f.Offered, f.Written, f.Repeats, f.Truncated, fmtCodes(f.Dropped), f.SinkErrs)
			fmt.Fprintf(w, "  file as read: %d lines (%d over the record cap), %d drop summaries telling %s, %d files unread\n",
				f.Lines, f.Overlong, f.Summaries, fmtCodes(f.Told), f.Unread)
			fmt.Fprintf(w, "  honest flow: %d decided (%d failed), %d in %d records (%d in the file as read), %d told dropped (metric %d): accounted %v\n",
				f.HonestDecided, f.HonestFailed, f.HonestWritten, f.HonestRecords, f.HonestInFile, f.HonestTold, f.HonestMetric, f.Accounted)
		}
		fmt.Fprintf(w, "  probe Decides failed during it or its settling: %d\n", s.ProbesFailed)
	}
	p := rep.Probes
	fmt.Fprintf(w, "\nprobe Decides: %d sent, %d answered, %d failed (target 0), %d skipped at the in-flight cap; p50 %s p99 %s max %s\n",
		p.Sent, p.OK, p.FailedLive, p.Skipped, ms(p.Latency.P50), ms(p.Latency.P99), ms(p.Latency.Max))
	writeVerdict(w, rep.Pass, rep.Problems, rep.Misses)
}

// revAt is a revision and when it was written or seen.
type revAt struct {
	rev int64
	at  time.Time
}

// awaitSeen waits until got (appended under mu) holds the last of writes'
// revisions, or until limit passes.
func awaitSeen(ctx context.Context, mu *sync.Mutex, got *[]revAt, writes []revAt, limit time.Duration) {
	if len(writes) == 0 {
		return
	}
	last := writes[len(writes)-1].rev
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		mu.Lock()
		n := len(*got)
		done := n > 0 && (*got)[n-1].rev >= last
		mu.Unlock()
		if done {
			return
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

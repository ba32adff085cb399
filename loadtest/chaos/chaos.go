// Package chaos runs verdict under faults with real processes on loopback — a
// 3-member etcd cluster embedded in this process, two verdictd replicas (the
// real binary, as child processes), a steady open-loop Decide load on both and
// a policy writer — and reports what the issue asks of it: Decide calls that
// failed (the target is none among those sent to a live replica), the longest
// time a replica served a snapshot older than an acknowledged write, and
// whether, once writes stop, every replica's snapshot digest equals the digest
// of etcd's contents. Soak runs mixed load for a long time and samples the
// goroutines and heap of each verdictd.
//
// Runs are bounded: every step has its duration, and the caller's context
// bounds the whole. Processes and temporary directories are removed at the
// end, also on failure; children die with this process (Linux).
// cmd/verdict-chaos is the command line; `make chaos` and `make soak` run it.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Config configures a chaos run. Zero values take the defaults.
type Config struct {
	// Verdictd is the verdictd binary the replicas run (required).
	Verdictd string
	// Dir holds etcd's data and the replicas' logs; empty: a temporary
	// directory, removed at the end.
	Dir string
	// Schedule is the faults, in order (default FullSchedule(8s, 6s)).
	Schedule []Step
	// DecideRate is Decide calls per second to each replica (default 200).
	DecideRate float64
	// DecideTimeout is each Decide call's deadline (default 100ms).
	DecideTimeout time.Duration
	// WriteRate is policy writes per second (default 10).
	WriteRate float64
	// StatusInterval is how often each replica's Status is read (default 20ms).
	StatusInterval time.Duration
	// Settle bounds the final wait for the replicas to reach etcd's revision
	// (default 30s).
	Settle time.Duration
	// Logger receives progress (each step as it starts); nil: discarded.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Schedule == nil {
		c.Schedule = FullSchedule(8*time.Second, 6*time.Second)
	}
	if c.DecideRate <= 0 {
		c.DecideRate = 200
	}
	if c.DecideTimeout <= 0 {
		c.DecideTimeout = 100 * time.Millisecond
	}
	if c.WriteRate <= 0 {
		c.WriteRate = 10
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = 20 * time.Millisecond
	}
	if c.Settle <= 0 {
		c.Settle = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Verdictd == "" {
		return errors.New("chaos: Verdictd (the binary) is required")
	}
	if c.DecideRate > 20000 || c.WriteRate > 1000 {
		return errors.New("chaos: rates beyond 20000 decides/s or 1000 writes/s per replica are not a chaos test")
	}
	return nil
}

// run is one chaos run in progress.
type run struct {
	cfg    Config
	env    *env
	obs    *observer
	writer *writer
	start  time.Time

	mu    sync.Mutex
	phase string
}

func (c *run) since() time.Duration { return time.Since(c.start).Round(time.Millisecond) }

func (c *run) setPhase(p string) {
	c.mu.Lock()
	c.phase = p
	c.mu.Unlock()
	c.cfg.Logger.Info("chaos step", "at", c.since(), "phase", p)
}

func (c *run) currentPhase() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.phase
}

// The policies the load decides against, in mesh default.
const basePolicies = `
kind: Mesh
name: default
---
kind: Policy
name: base-allow
sources: [{match: {kuma.io/service: web}}]
destinations: [{match: {kuma.io/service: backend}}]
ports: [{protocol: TCP, ports: "8080"}]
---
kind: Policy
name: base-deny
sources: [{match: {kuma.io/service: '*'}}]
destinations: [{match: {kuma.io/service: db}}]
action: DENY
`

func flows() []*verdictv1.DecideRequest {
	w := func(svc string) *verdictv1.Endpoint {
		return &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: svc, "env": "chaos"}}
	}
	return []*verdictv1.DecideRequest{
		{Source: w("web"), Destination: w("backend"), Protocol: "TCP", Port: 8080},
		{Source: w("web"), Destination: w("db"), Protocol: "TCP", Port: 5432},
		{Source: w("batch"), Destination: w("backend"), Protocol: "TCP", Port: 8080},
		{Source: w("cw-1"), Destination: w(chaosDst)},
	}
}

// Run runs the schedule and returns the report; err is for a run that could
// not be carried out (etcd or verdictd did not start), not for the figures,
// which the report judges (Report.Pass).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	dir, cleanup, err := makeDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cfg.Logger.Info("starting etcd (3 members) and verdictd (2 replicas)", "dir", dir)
	e, err := newEnv(ctx, dir, cfg.Verdictd, 3, 2)
	if err != nil {
		return nil, err
	}
	defer e.close()
	c := &run{cfg: cfg, env: e, phase: "setup"}
	c.obs = newObserver(e.replicas, c.currentPhase)
	c.writer = newWriter(e, c.obs)
	seedRev, err := seed(ctx, e)
	if err != nil {
		return nil, err
	}
	c.start = time.Now()
	rep := &Report{Started: c.start, Schedule: cfg.Schedule, DecideRate: cfg.DecideRate, DecideTimeout: cfg.DecideTimeout,
		WriteRate: cfg.WriteRate, Topology: e.topology(), SeedRevision: seedRev}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	writeCtx, stopWrites := context.WithCancel(loadCtx)
	defer stopWrites()
	dec := newDeciders(e.replicas, flows(), cfg.DecideRate, cfg.DecideTimeout, c.obs, c.currentPhase)
	var wg sync.WaitGroup
	wg.Go(func() { dec.run(loadCtx, c.start) })
	wg.Go(func() { c.obs.poll(loadCtx, cfg.StatusInterval) })
	var writes sync.WaitGroup
	writes.Go(func() { c.writer.run(writeCtx, cfg.WriteRate) })

	for i, s := range cfg.Schedule {
		if ctx.Err() != nil {
			break
		}
		rep.Steps = append(rep.Steps, c.runStep(ctx, i+1, s))
	}
	c.setPhase("final check")
	stopWrites()
	writes.Wait()
	c.final(ctx, rep)
	stopLoad()
	wg.Wait()
	rep.Duration = c.since()
	rep.collect(c, dec)
	if ctx.Err() != nil {
		rep.Problems = append(rep.Problems, "the run was cut short: "+ctx.Err().Error())
		rep.Pass = false
	}
	return rep, nil
}

// seed writes the base policies through r0 and waits until both replicas
// serve them.
func seed(ctx context.Context, e *env) (int64, error) {
	rs, err := resource.DecodeYAML([]byte(basePolicies))
	if err != nil {
		return 0, err
	}
	req := &verdictv1.ApplyRequest{}
	for _, r := range rs {
		p, err := apiconv.ResourceToProto(r)
		if err != nil {
			return 0, err
		}
		req.Resources = append(req.Resources, p)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := e.replicas[0].current().pol.Apply(cctx, req)
	if err != nil {
		return 0, fmt.Errorf("seed policies: %w", err)
	}
	for _, r := range e.replicas {
		if _, err := r.current().dec.Decide(cctx, &verdictv1.DecideRequest{MinRevision: resp.GetRevision()}); err != nil {
			return 0, fmt.Errorf("%s: seed policies not visible: %w", r.name, err)
		}
	}
	return resp.GetRevision(), nil
}

func (e *env) topology() string {
	return "etcd m0,m1,m2 (embedded, loopback); r0 → m0 (through a proxy); r1 → m1,m2"
}

// final waits for every replica to reach etcd's revision, then compares
// digests, the writer's model, and decisions for the acknowledged writes.
func (c *run) final(ctx context.Context, rep *Report) {
	e := c.env
	for i, m := range e.cluster.Members {
		if !m.Running() {
			rep.Problems = append(rep.Problems, fmt.Sprintf("etcd m%d is not running at the end", i))
		}
	}
	st, err := e.etcdState(ctx)
	if err != nil {
		rep.Problems = append(rep.Problems, "read etcd: "+err.Error())
		return
	}
	rep.Etcd = EtcdReport{Revision: st.Revision, Digest: st.Digest, Keys: len(st.Values)}
	for _, r := range e.replicas {
		fr := FinalReplica{Name: r.name}
		begin := time.Now()
		cctx, cancel := context.WithTimeout(ctx, c.cfg.Settle)
		s, err := r.current().pol.Status(cctx, &verdictv1.StatusRequest{MinRevision: st.Revision})
		cancel()
		if err != nil {
			fr.Error = err.Error()
			rep.Final = append(rep.Final, fr)
			continue
		}
		fr.CaughtUpIn = time.Since(begin).Round(time.Millisecond)
		fr.Revision, fr.Digest, fr.Invalid, fr.Stale = s.GetRevision(), s.GetDigest(), len(s.GetInvalid()), s.GetStale()
		fr.DigestEqual = fr.Digest == st.Digest
		c.obs.observe(r, time.Now(), s.GetRevision())
		fr.Unseen = len(c.obs.unseen(r))
		rep.Final = append(rep.Final, fr)
	}
	// Nothing wrote meanwhile?
	if again, err := e.etcdState(ctx); err == nil && again.Digest != st.Digest {
		rep.Problems = append(rep.Problems, fmt.Sprintf("etcd changed during the final check (revision %d → %d)", st.Revision, again.Revision))
	}
	lost := c.writer.check(st)
	rep.lost = lost
	probes := c.writer.probes(200)
	for i, r := range e.replicas {
		for _, p := range probes {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d, err := r.current().dec.Decide(cctx, &verdictv1.DecideRequest{MinRevision: st.Revision,
				Source:      &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: p.src}},
				Destination: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: chaosDst}}})
			cancel()
			name := p.key[len("default/policies/"+writeType+"/"):]
			switch {
			case err != nil:
				rep.Final[i].ProbeErrors = append(rep.Final[i].ProbeErrors, fmt.Sprintf("%s: %v", p.key, err))
			case p.present && (d.GetAction() != verdictv1.Action_ACTION_ALLOW || d.GetPolicy() != name),
				!p.present && d.GetAction() != verdictv1.Action_ACTION_DENY:
				rep.Final[i].ProbeErrors = append(rep.Final[i].ProbeErrors,
					fmt.Sprintf("%s (present %v): %s by %q", p.key, p.present, d.GetAction(), d.GetPolicy()))
			}
		}
	}
	rep.probed = len(probes)
}

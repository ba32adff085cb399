package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// SoakConfig configures a soak run. Zero values take the defaults.
type SoakConfig struct {
	Verdictd string // the verdictd binary (required)
	Dir      string // as Config.Dir
	// Duration of the mixed load (default 10m) and how often each replica's
	// goroutines and heap are sampled (default 1m).
	Duration, Sample time.Duration
	// DecideRate per replica (default 300/s), each call with DecideTimeout
	// (default 1s); WriteRate policy writes per second over a fixed set of
	// keys (default 20/s).
	DecideRate    float64
	DecideTimeout time.Duration
	WriteRate     float64
	// Streams open at any time, each living a random while before another
	// opens: WatchRules (default 50, 1-5 s), WatchResources (4, 2-10 s),
	// DecideStream (4, 1-5 s).
	RuleStreams, ResourceStreams, DecideStreams int
	Logger                                      *slog.Logger
}

func (c SoakConfig) withDefaults() SoakConfig {
	if c.Duration <= 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Sample <= 0 {
		c.Sample = time.Minute
	}
	if c.DecideRate <= 0 {
		c.DecideRate = 300
	}
	if c.DecideTimeout <= 0 {
		c.DecideTimeout = time.Second
	}
	if c.WriteRate <= 0 {
		c.WriteRate = 20
	}
	if c.RuleStreams <= 0 {
		c.RuleStreams = 50
	}
	if c.ResourceStreams <= 0 {
		c.ResourceStreams = 4
	}
	if c.DecideStreams <= 0 {
		c.DecideStreams = 4
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// soakKeys is the fixed set of policies the soak's writes churn: the store
// stays the same size, so a growing heap is a leak, not more data.
const soakKeys = 500

// Sample is one reading of a replica's /metrics.
type Sample struct {
	At         time.Duration `json:"at"` // since the load started; negative: before
	Goroutines int64         `json:"goroutines"`
	HeapLive   int64         `json:"heapLiveBytes"`  // go_gc_heap_live_bytes: marked live by the last GC
	HeapInuse  int64         `json:"heapInuseBytes"` // go_memstats_heap_inuse_bytes
	RSS        int64         `json:"rssBytes"`       // process_resident_memory_bytes
}

// SoakReplica is one replica's samples and growth.
type SoakReplica struct {
	Name string `json:"name"`
	// IdleBefore: before any load; IdleAfter: after the load stopped and its
	// streams closed. The goroutines must come back (a stream that leaves
	// goroutines behind is a leak).
	IdleBefore Sample   `json:"idleBefore"`
	Samples    []Sample `json:"samples"`
	IdleAfter  Sample   `json:"idleAfter"`
	// Growth under load, from the first sample after the warm-up (the
	// policy set fills up during the first minute) to the last, and the
	// least-squares slope of the live heap over those samples.
	From            time.Duration `json:"growthFrom"`
	GoroutineGrowth int64         `json:"goroutineGrowth"`
	HeapLiveGrowth  int64         `json:"heapLiveGrowthBytes"`
	HeapLiveGrowthP float64       `json:"heapLiveGrowthPercent"`
	HeapLiveSlope   float64       `json:"heapLiveSlopeBytesPerMinute"`
	IdleGoroutines  int64         `json:"idleGoroutineGrowth"` // IdleAfter - IdleBefore
	Decide          ReplicaReport
}

// growth fills the growth figures from the samples at or after from.
func (sr *SoakReplica) growth(from time.Duration) {
	var ss []Sample
	for _, s := range sr.Samples {
		if s.At >= from {
			ss = append(ss, s)
		}
	}
	if len(ss) < 2 {
		ss = sr.Samples
	}
	if len(ss) == 0 {
		return
	}
	first, last := ss[0], ss[len(ss)-1]
	sr.From = first.At
	sr.GoroutineGrowth = last.Goroutines - first.Goroutines
	sr.HeapLiveGrowth = last.HeapLive - first.HeapLive
	if first.HeapLive > 0 {
		sr.HeapLiveGrowthP = 100 * float64(sr.HeapLiveGrowth) / float64(first.HeapLive)
	}
	var n, sx, sy, sxx, sxy float64
	for _, s := range ss {
		x, y := s.At.Minutes(), float64(s.HeapLive)
		n, sx, sy, sxx, sxy = n+1, sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	if d := n*sxx - sx*sx; d > 0 {
		sr.HeapLiveSlope = (n*sxy - sx*sy) / d
	}
}

// SoakReport is a soak run's result. Problems: a call failed with an error
// other than its deadline, a stream failed, or the goroutines did not come back
// to their idle count. Misses: Decide calls that ran out of their deadline (the
// latency target, which depends on the machine's load; see Report). Pass: no
// problem and no miss.
type SoakReport struct {
	Duration time.Duration    `json:"duration"`
	Sample   time.Duration    `json:"sample"`
	Load     string           `json:"load"`
	Replicas []SoakReplica    `json:"replicas"`
	Writes   int64            `json:"writes"`
	Streams  map[string]int64 `json:"streams"` // opened and failed, by kind
	Errors   map[string]int64 `json:"errors,omitempty"`
	Pass     bool             `json:"pass"`
	Problems []string         `json:"problems,omitempty"`
	Misses   []string         `json:"misses,omitempty"`
}

// idleSlack is how many goroutines more than before the load a replica may
// hold once it is idle again (timers and connection goroutines come and go).
const idleSlack = 10

// Soak runs the mixed load and samples each replica.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	if cfg.Verdictd == "" {
		return nil, errors.New("chaos: Verdictd (the binary) is required")
	}
	cfg = cfg.withDefaults()
	dir, cleanup, err := makeDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cfg.Logger.Info("starting etcd and verdictd (2 replicas)", "dir", dir)
	e, err := newEnv(ctx, dir, cfg.Verdictd, 1, 2)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if _, err := seed(ctx, e); err != nil {
		return nil, err
	}
	s := &soak{cfg: cfg, env: e, streams: map[string]int64{}, errs: map[string]int64{}}
	rep := &SoakReport{Sample: cfg.Sample,
		Load: fmt.Sprintf("Decide %.0f/s and DecideBatch 10/s per replica; %.0f writes/s over %d policies; %d WatchRules, %d WatchResources, %d DecideStream streams open at any time, each closing after a few seconds",
			cfg.DecideRate, cfg.WriteRate, soakKeys, cfg.RuleStreams, cfg.ResourceStreams, cfg.DecideStreams)}
	for _, r := range e.replicas {
		rep.Replicas = append(rep.Replicas, SoakReplica{Name: r.name})
	}
	sleepCtx(ctx, 2*time.Second)
	s.sampleAll(ctx, rep, func(sr *SoakReplica, smp Sample) { sr.IdleBefore = smp }, -1)

	start := time.Now()
	loadCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	obs := newObserver(e.replicas, func() string { return "soak" })
	dec := newDeciders(e.replicas, flows(), cfg.DecideRate, cfg.DecideTimeout, obs, func() string { return "soak" })
	var wg sync.WaitGroup
	wg.Go(func() { dec.run(loadCtx, start) })
	wg.Go(func() { s.write(loadCtx) })
	wg.Go(func() { s.compact(loadCtx) })
	for i := range cfg.RuleStreams {
		wg.Go(func() { s.streamLoop(loadCtx, i, "WatchRules", time.Second, 5*time.Second, s.watchRules) })
	}
	for i := range cfg.ResourceStreams {
		wg.Go(func() { s.streamLoop(loadCtx, i, "WatchResources", 2*time.Second, 10*time.Second, s.watchResources) })
	}
	for i := range cfg.DecideStreams {
		wg.Go(func() { s.streamLoop(loadCtx, i, "DecideStream", time.Second, 5*time.Second, s.decideStream) })
	}
	for i := range e.replicas {
		wg.Go(func() { s.batches(loadCtx, i) })
	}
	// Samples: at the start of the load (after a short warm-up), then every
	// Sample until the end.
	sleepCtx(loadCtx, min(10*time.Second, cfg.Sample/4))
	for {
		at := time.Since(start)
		s.sampleAll(ctx, rep, func(sr *SoakReplica, smp Sample) { sr.Samples = append(sr.Samples, smp) }, at)
		cfg.Logger.Info("soak sample", "at", at.Round(time.Second))
		wait := cfg.Sample
		if left := time.Until(start.Add(cfg.Duration)); left < wait {
			if left < cfg.Sample/2 {
				break
			}
			wait = left - time.Second
		}
		sleepCtx(loadCtx, wait)
		if loadCtx.Err() != nil {
			break
		}
	}
	stop()
	wg.Wait()
	rep.Duration = time.Since(start).Round(time.Second)
	// Idle again: streams closed by the clients end on the server at once;
	// give the server's stream goroutines and gRPC a moment.
	sleepCtx(ctx, 3*time.Second)
	s.sampleAll(ctx, rep, func(sr *SoakReplica, smp Sample) { sr.IdleAfter = smp }, time.Since(start))
	s.judge(rep, dec)
	return rep, nil
}

type soak struct {
	cfg    SoakConfig
	env    *env
	writes atomic.Int64

	mu      sync.Mutex
	streams map[string]int64
	errs    map[string]int64
}

func (s *soak) count(m map[string]int64, k string) {
	s.mu.Lock()
	m[k]++
	s.mu.Unlock()
}

// sampleAll reads every replica's /metrics.
func (s *soak) sampleAll(ctx context.Context, rep *SoakReport, put func(*SoakReplica, Sample), at time.Duration) {
	for i, r := range s.env.replicas {
		smp, err := scrape(ctx, r.metrics)
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: /metrics: %v", r.name, err))
			continue
		}
		smp.At = at.Round(time.Second)
		put(&rep.Replicas[i], smp)
	}
}

// scrape reads the runtime figures of one /metrics endpoint.
func scrape(ctx context.Context, addr string) (Sample, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	vals, err := parseMetrics(resp.Body, "go_goroutines", "go_gc_heap_live_bytes", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes")
	if err != nil {
		return Sample{}, err
	}
	return Sample{Goroutines: vals[0], HeapLive: vals[1], HeapInuse: vals[2], RSS: vals[3]}, nil
}

// parseMetrics reads the values of unlabelled metrics from the Prometheus
// text format; a metric that is missing is an error.
func parseMetrics(r io.Reader, names ...string) ([]int64, error) {
	want := map[string]int{}
	for i, n := range names {
		want[n] = i
	}
	out := make([]int64, len(names))
	found := make([]bool, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		i, known := want[name]
		if !ok || !known {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[i], found[i] = int64(f), true
	}
	for i, ok := range found {
		if !ok {
			return nil, fmt.Errorf("no %s in /metrics (verdictd registers the Go and process collectors)", names[i])
		}
	}
	return out, sc.Err()
}

// live returns a live replica at random (nil if none).
func (s *soak) live(r *rand.Rand) *replica {
	rs := s.env.replicas
	for range len(rs) {
		c := rs[r.IntN(len(rs))]
		if c.isLive.Load() {
			return c
		}
	}
	return nil
}

// write churns soakKeys policies: a new version of a random key, or its
// delete, at WriteRate.
func (s *soak) write(ctx context.Context) {
	r := rand.New(rand.NewPCG(1, 2))
	t := time.NewTicker(time.Duration(float64(time.Second) / s.cfg.WriteRate))
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep := s.live(r)
		if rep == nil {
			continue
		}
		k := r.IntN(soakKeys)
		name := fmt.Sprintf("soak-%d", k)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if n%10 == 9 {
			_, err = rep.current().pol.Delete(cctx, &verdictv1.DeleteRequest{Keys: []string{policyKey(name)}})
			if status.Code(err) == codes.NotFound {
				err = nil
			}
		} else {
			p := &resource.Policy{Mesh: resource.DefaultMesh, Type: writeType, Name: name, Action: resource.Allow,
				Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-%d", r.IntN(200))}}},
				Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-%d", r.IntN(200)), "v": strconv.Itoa(n)}}}}
			res, perr := apiconv.ResourceToProto(p)
			if perr != nil {
				panic(perr) // a constant policy that does not convert is a bug here
			}
			_, err = rep.current().pol.Apply(cctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{res}})
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			s.count(s.errs, "write "+status.Code(err).String())
			continue
		}
		s.writes.Add(1)
	}
}

// compact compacts etcd every 30 s, as an operator's policy would.
func (s *soak) compact(ctx context.Context) {
	for {
		sleepCtx(ctx, 30*time.Second)
		if ctx.Err() != nil {
			return
		}
		_, _ = s.env.compact(ctx)
	}
}

// batches sends a DecideBatch of 100 flows to replica i every 100 ms.
func (s *soak) batches(ctx context.Context, i int) {
	r := s.env.replicas[i]
	fl := flows()
	req := &verdictv1.DecideBatchRequest{}
	for n := range 100 {
		req.Requests = append(req.Requests, fl[n%len(fl)])
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.DecideTimeout)
		_, err := r.current().dec.DecideBatch(cctx, req)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.count(s.errs, "DecideBatch "+status.Code(err).String())
		}
	}
}

// streamLoop keeps one stream of a kind open: it opens it on a live replica,
// lets open run it for a random lifetime in [lo, hi), closes it, and opens
// the next.
func (s *soak) streamLoop(ctx context.Context, i int, kind string, lo, hi time.Duration,
	open func(ctx context.Context, c *clients, r *rand.Rand) error) {
	r := rand.New(rand.NewPCG(uint64(i), uint64(len(kind))))
	for ctx.Err() == nil {
		rep := s.live(r)
		if rep == nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		// The lifetime ends the stream by cancelling it, not as a deadline:
		// a deadline travels to the server, which could end the stream with
		// DEADLINE_EXCEEDED a moment before this side notices its own.
		life := lo + time.Duration(r.Int64N(int64(hi-lo)))
		sctx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(life, cancel)
		s.count(s.streams, kind+" opened")
		err := open(sctx, rep.current(), r)
		if err != nil && sctx.Err() == nil {
			s.count(s.streams, kind+" failed: "+status.Code(err).String())
		}
		timer.Stop()
		cancel()
	}
}

func (s *soak) watchRules(ctx context.Context, c *clients, r *rand.Rand) error {
	st, err := c.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{
		Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("svc-%d", r.IntN(200))}}})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

func (s *soak) watchResources(ctx context.Context, c *clients, _ *rand.Rand) error {
	st, err := c.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{Prefix: "default/"})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// decideStream sends 50 flows a second on one DecideStream and reads the
// answers; at the end of its life it closes its side and drains.
func (s *soak) decideStream(ctx context.Context, c *clients, r *rand.Rand) error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	st, err := c.dec.DecideStream(sctx)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if e := resp.GetResult().GetError(); e != nil {
				s.count(s.errs, "DecideStream answer "+e.GetCode())
			}
		}
	}()
	fl := flows()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			_ = st.CloseSend()
			select {
			case err := <-recvErr:
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			case <-time.After(5 * time.Second):
				return errors.New("the stream did not end within 5 s of the client closing it")
			}
		case err := <-recvErr:
			return err
		case <-t.C:
			if err := st.Send(&verdictv1.DecideStreamRequest{Id: strconv.Itoa(n), Request: fl[r.IntN(len(fl))]}); err != nil {
				return err
			}
		}
	}
}

func (s *soak) judge(rep *SoakReport, dec *deciders) {
	rep.Writes = s.writes.Load()
	s.mu.Lock()
	rep.Streams, rep.Errors = s.streams, s.errs
	s.mu.Unlock()
	for i := range rep.Replicas {
		sr := &rep.Replicas[i]
		st := dec.stats[i]
		st.mu.Lock()
		sr.Decide = ReplicaReport{Name: sr.Name, Sent: st.sent, OK: st.ok, FailedLiveBy: st.liveFailed, Latency: summarize(&st.latency),
			Failures: st.failures}
		st.mu.Unlock()
		for _, n := range sr.Decide.FailedLiveBy {
			sr.Decide.FailedLive += n
		}
		timedOut := sr.Decide.FailedLiveBy[codes.DeadlineExceeded.String()]
		if n := sr.Decide.FailedLive - timedOut; n > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d Decide calls failed with an error", sr.Name, n))
		}
		if timedOut > 0 {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %d Decide calls ran out of their deadline", sr.Name, timedOut))
		}
		sr.growth(min(time.Minute, rep.Duration/5))
		sr.IdleGoroutines = sr.IdleAfter.Goroutines - sr.IdleBefore.Goroutines
		if sr.IdleAfter.Goroutines > 0 && sr.IdleGoroutines > idleSlack {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d goroutines idle after the load, %d before: a leak",
				sr.Name, sr.IdleAfter.Goroutines, sr.IdleBefore.Goroutines))
		}
	}
	for k, n := range rep.Streams {
		if strings.Contains(k, "failed") {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%d streams: %s", n, k))
		}
	}
	for k, n := range rep.Errors {
		if strings.HasSuffix(k, " "+codes.DeadlineExceeded.String()) {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%d calls ran out of their deadline: %s", n, k))
			continue
		}
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d errors: %s", n, k))
	}
	rep.Pass = len(rep.Problems) == 0 && len(rep.Misses) == 0
}

// WriteJSON writes the report as indented JSON.
func (rep *SoakReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// WriteText prints the report for people.
func (rep *SoakReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "verdict-chaos soak: %v of mixed load, sampled every %v\n  %s\n", rep.Duration, rep.Sample, rep.Load)
	for _, sr := range rep.Replicas {
		fmt.Fprintf(w, "\n%s        at  goroutines  heap live    heap in use  RSS\n", sr.Name)
		line := func(label string, s Sample) {
			fmt.Fprintf(w, "  %-12s %6s  %10d  %-11s  %-11s  %s\n", label, s.At.Round(time.Second), s.Goroutines, mib(s.HeapLive), mib(s.HeapInuse), mib(s.RSS))
		}
		line("idle before", sr.IdleBefore)
		for _, s := range sr.Samples {
			line("under load", s)
		}
		line("idle after", sr.IdleAfter)
		fmt.Fprintf(w, "  growth under load (from %v to the end): goroutines %+d, heap live %+.1f MiB (%+.1f%%), slope %+.2f MiB/min\n",
			sr.From, sr.GoroutineGrowth, float64(sr.HeapLiveGrowth)/(1<<20), sr.HeapLiveGrowthP, sr.HeapLiveSlope/(1<<20))
		fmt.Fprintf(w, "  idle after vs idle before: goroutines %+d (a leak if more than %d)\n", sr.IdleGoroutines, idleSlack)
		fmt.Fprintf(w, "  Decide: %d sent, %d answered, %d failed; p50 %s p99 %s max %s\n", sr.Decide.Sent, sr.Decide.OK,
			sr.Decide.FailedLive, ms(sr.Decide.Latency.P50), ms(sr.Decide.Latency.P99), ms(sr.Decide.Latency.Max))
	}
	fmt.Fprintf(w, "\nwrites: %d; streams: %s; errors: %s\n", rep.Writes, fmtCodes(rep.Streams), fmtCodes(rep.Errors))
	writeVerdict(w, rep.Pass, rep.Problems, rep.Misses)
}

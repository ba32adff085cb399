package chaos

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/loadtest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// deciders send Decide calls to every replica at a steady rate (open loop:
// a call is sent when it is due, whatever the answers), each with its own
// deadline, and classify every failure by the state of its replica:
//   - live: the replica was serving when the call was sent and was not killed
//     before the answer — these must all succeed;
//   - killed in flight: sent while live, cut by a kill -9 of the replica;
//   - down: sent while the replica was down or restarting (not yet SERVING).
type deciders struct {
	replicas []*replica
	flows    []*verdictv1.DecideRequest
	rate     float64
	timeout  time.Duration
	obs      *observer
	phase    func() string

	stats []*callStats
}

// callStats are one replica's Decide figures.
type callStats struct {
	mu             sync.Mutex
	sent           int64
	ok             int64
	liveFailed     map[string]int64 // by code
	failedInPhase  map[string]int64 // by the phase they were sent in
	killedInFlight int64
	down           int64 // sent while down or restarting
	downOK         int64 // of which answered anyway
	skipped        int64 // not sent: too many in flight
	latency        loadtest.Histogram
	failures       []Failure // the first live failures
	calls          []call    // answered calls, for the ordering check
}

type call struct {
	sent, done time.Time
	rev        int64
}

// Failure is one failed Decide call sent to a live replica.
type Failure struct {
	At      time.Duration `json:"at"` // since the start of the run
	Replica string        `json:"replica"`
	Phase   string        `json:"phase"`
	Code    string        `json:"code"`
	Message string        `json:"message"`
}

const maxInFlight = 512

func newDeciders(rs []*replica, flows []*verdictv1.DecideRequest, rate float64, timeout time.Duration, obs *observer, phase func() string) *deciders {
	d := &deciders{replicas: rs, flows: flows, rate: rate, timeout: timeout, obs: obs, phase: phase}
	for range rs {
		d.stats = append(d.stats, &callStats{liveFailed: map[string]int64{}, failedInPhase: map[string]int64{}})
	}
	return d
}

// run sends until ctx ends, then waits for the calls in flight.
func (d *deciders) run(ctx context.Context, start time.Time) {
	var wg sync.WaitGroup
	for i := range d.replicas {
		wg.Go(func() { d.drive(ctx, i, start) })
	}
	wg.Wait()
}

func (d *deciders) drive(ctx context.Context, i int, start time.Time) {
	r, st := d.replicas[i], d.stats[i]
	interval := time.Duration(float64(time.Second) / d.rate)
	var inFlight atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	next := time.Now()
	for n := 0; ; n++ {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		next = next.Add(interval)
		if inFlight.Load() >= maxInFlight {
			st.mu.Lock()
			st.skipped++
			st.mu.Unlock()
			continue
		}
		inFlight.Add(1)
		flow := d.flows[(n+i)%len(d.flows)]
		wg.Go(func() {
			defer inFlight.Add(-1)
			d.one(r, st, flow, start)
		})
	}
}

func (d *deciders) one(r *replica, st *callStats, flow *verdictv1.DecideRequest, start time.Time) {
	live, deaths := r.isLive.Load(), r.deaths.Load()
	c := r.current()
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	sent := time.Now()
	resp, err := c.dec.Decide(ctx, flow)
	done := time.Now()
	cancel()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sent++
	switch {
	case !live:
		st.down++
		if err == nil {
			st.downOK++
		}
	case err == nil:
		st.ok++
		st.latency.Record(done.Sub(sent))
		st.calls = append(st.calls, call{sent: sent, done: done, rev: resp.GetRevision()})
	case r.deaths.Load() != deaths:
		st.killedInFlight++
	default:
		code := status.Code(err)
		if errors.Is(err, context.DeadlineExceeded) {
			code = codes.DeadlineExceeded
		}
		st.liveFailed[code.String()]++
		phase := d.phase()
		st.failedInPhase[phase]++
		if len(st.failures) < 20 {
			st.failures = append(st.failures, Failure{At: sent.Sub(start), Replica: r.name, Phase: phase,
				Code: code.String(), Message: status.Convert(err).Message()})
		}
	}
	if err == nil && live {
		d.obs.observe(r, done, resp.GetRevision())
	}
}

// regressions counts answers from a snapshot older than one an earlier call
// (answered before this one was sent) had seen: the replica went back in
// time. Restarts included: a cold start lists etcd at its current revision.
func regressions(calls []call) int {
	bySent := append([]call(nil), calls...)
	sort.Slice(bySent, func(i, j int) bool { return bySent[i].sent.Before(bySent[j].sent) })
	byDone := append([]call(nil), calls...)
	sort.Slice(byDone, func(i, j int) bool { return byDone[i].done.Before(byDone[j].done) })
	n, j := 0, 0
	var seen int64
	for _, c := range bySent {
		for ; j < len(byDone) && byDone[j].done.Before(c.sent); j++ {
			seen = max(seen, byDone[j].rev)
		}
		if c.rev < seen {
			n++
		}
	}
	return n
}

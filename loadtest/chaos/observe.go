package chaos

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/verdictpdp/verdict/loadtest"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// observer follows what each replica serves: the revision of every answer
// (Decide and Status) and Status's stale flag. For every acknowledged write it
// measures, per replica, how long the replica served a snapshot without it:
// the time the replica was live between the write's acknowledgment and its
// first answer at or after the write's revision.
type observer struct {
	replicas []*replica
	phase    func() string

	mu    sync.Mutex
	state map[*replica]*seen
}

type seen struct {
	rev      int64 // the newest revision answered
	waiting  []pendingWrite
	lag      loadtest.Histogram
	worst    StalePeriod
	stale    StalePeriod // longest continuous Status.stale = true
	staleRun time.Time   // start of the current stale run; zero: none
	staleAt  string
	last     time.Time                // last stale observation of the run
	status   []call                   // Status answers, for the ordering check
	byPhase  map[string]time.Duration // the longest stale served, by the phase of the write
	flagBy   map[string]time.Duration // the longest stale flag, by the phase it began in
	polls    int64
	pollErrs int64

	healthChecks int64
	notServing   int64 // health answers other than SERVING from a live replica
	// health checks of a live replica that ran out of their deadline
	healthTimedOut int64
}

type pendingWrite struct {
	rev   int64
	acked time.Time
	phase string
}

// StalePeriod is a measured period and when it happened.
type StalePeriod struct {
	Duration time.Duration `json:"duration"`
	Phase    string        `json:"phase,omitempty"`
	Revision int64         `json:"revision,omitempty"` // the write it waited for
}

func newObserver(rs []*replica, phase func() string) *observer {
	o := &observer{replicas: rs, phase: phase, state: map[*replica]*seen{}}
	for _, r := range rs {
		o.state[r] = &seen{byPhase: map[string]time.Duration{}, flagBy: map[string]time.Duration{}}
	}
	return o
}

// acked registers an acknowledged write at rev.
func (o *observer) acked(rev int64, at time.Time) {
	if rev <= 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.phase()
	for _, s := range o.state {
		if s.rev >= rev {
			s.lag.Record(0)
			continue
		}
		s.waiting = append(s.waiting, pendingWrite{rev: rev, acked: at, phase: p})
	}
}

// observe notes that r answered from a snapshot at rev at time at.
func (o *observer) observe(r *replica, at time.Time, rev int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.state[r]
	s.rev = max(s.rev, rev)
	keep := s.waiting[:0]
	for _, w := range s.waiting {
		if w.rev > rev {
			keep = append(keep, w)
			continue
		}
		served := r.servedBetween(w.acked, at)
		s.lag.Record(served)
		s.byPhase[w.phase] = max(s.byPhase[w.phase], served)
		if served > s.worst.Duration {
			s.worst = StalePeriod{Duration: served, Phase: w.phase, Revision: w.rev}
		}
	}
	s.waiting = keep
}

// poll asks every live replica for its Status every interval until ctx ends.
func (o *observer) poll(ctx context.Context, interval time.Duration) {
	var wg sync.WaitGroup
	for _, r := range o.replicas {
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if r.isLive.Load() {
					o.pollOnce(ctx, r)
				}
			}
		})
	}
	wg.Wait()
}

func (o *observer) pollOnce(ctx context.Context, r *replica) {
	c := r.current()
	deaths := r.deaths.Load()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	sent := time.Now()
	st, err := c.pol.Status(cctx, &verdictv1.StatusRequest{})
	done := time.Now()
	cancel()
	o.mu.Lock()
	s := o.state[r]
	s.polls++
	if s.polls%5 == 0 {
		// Health must stay SERVING while the replica lives, etcd or not.
		o.mu.Unlock()
		hctx, hcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		h, herr := c.health.Check(hctx, &healthpb.HealthCheckRequest{})
		hcancel()
		o.mu.Lock()
		if ctx.Err() == nil && r.deaths.Load() == deaths {
			s.healthChecks++
			switch {
			case herr != nil && (status.Code(herr) == codes.DeadlineExceeded || errors.Is(herr, context.DeadlineExceeded)):
				s.healthTimedOut++
			case herr != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING:
				s.notServing++
			}
		}
	}
	if err != nil {
		s.pollErrs++
		o.mu.Unlock()
		return
	}
	s.status = append(s.status, call{sent: sent, done: done, rev: st.GetRevision()})
	switch {
	case st.GetStale() && s.staleRun.IsZero():
		s.staleRun, s.staleAt, s.last = done, o.phase(), done
	case st.GetStale():
		s.last = done
	case !s.staleRun.IsZero():
		o.endStaleRun(s, done)
	}
	o.mu.Unlock()
	o.observe(r, done, st.GetRevision())
}

func (o *observer) endStaleRun(s *seen, end time.Time) {
	d := end.Sub(s.staleRun)
	if d > s.stale.Duration {
		s.stale = StalePeriod{Duration: d, Phase: s.staleAt}
	}
	s.flagBy[s.staleAt] = max(s.flagBy[s.staleAt], d)
	s.staleRun = time.Time{}
}

// down closes r's stale run at its last stale answer (a dead replica serves
// nothing).
func (o *observer) down(r *replica) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.state[r]
	if !s.staleRun.IsZero() {
		o.endStaleRun(s, s.last)
	}
}

// unseen returns the acknowledged writes r has not answered at or after.
func (o *observer) unseen(r *replica) []pendingWrite {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]pendingWrite(nil), o.state[r].waiting...)
}

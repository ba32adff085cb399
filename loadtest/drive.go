package loadtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// call performs request i on behalf of a worker and returns how many flows it
// decided and its error.
type call func(ctx context.Context, worker int, i int64) (decisions int, err error)

// Limits bound a run: it stops at the first of Duration and Requests.
type Limits struct {
	Duration time.Duration // default 5s
	Requests int64         // 0: no limit but the duration; warm-up calls count too
	Warmup   time.Duration // calls made before this are not recorded
}

func (l Limits) withDefaults() Limits {
	if l.Duration <= 0 {
		l.Duration = 5 * time.Second
	}
	return l
}

type worker struct {
	hist      Histogram
	count     int64
	decisions int64
	errors    map[string]int64
	late      int64
}

func (w *worker) done(start time.Time, end time.Time, n int, err error, record bool) {
	if !record {
		return
	}
	w.hist.Record(end.Sub(start))
	w.count++
	w.decisions += int64(n)
	if err != nil {
		if w.errors == nil {
			w.errors = map[string]int64{}
		}
		w.errors[codeName(err)]++
	}
}

func codeName(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded.String()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	return codes.Unknown.String()
}

func collect(name string, workers []*worker, elapsed time.Duration) *Report {
	r := &Report{Scenario: name, Duration: elapsed}
	var h Histogram
	var decisions int64
	for _, w := range workers {
		h.Merge(&w.hist)
		r.Count += w.count
		decisions += w.decisions
		r.Late += w.late
		for c, n := range w.errors {
			if r.Errors == nil {
				r.Errors = map[string]int64{}
			}
			r.Errors[c] += n
		}
	}
	r.Latency = summarize(&h)
	if s := elapsed.Seconds(); s > 0 {
		r.RPS = float64(r.Count) / s
		r.DecisionsPerSec = float64(decisions) / s
	}
	return r
}

// callTimeout bounds one call; a run never cancels calls in flight (a call cut
// off by the end of the run would count as a failure of the target).
const callTimeout = 10 * time.Second

func withCallTimeout(ctx context.Context, fn call) call {
	return func(ctx context.Context, w int, i int64) (int, error) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return fn(cctx, w, i)
	}
}

// closedLoop runs concurrency workers that each send a request as soon as the
// previous one is answered, until the duration (after the warm-up) or the
// request limit is reached; calls in flight then finish.
func closedLoop(ctx context.Context, name string, concurrency int, lim Limits, fn call) *Report {
	lim = lim.withDefaults()
	fn = withCallTimeout(ctx, fn)
	workers := make([]*worker, concurrency)
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	recordFrom := begin.Add(lim.Warmup)
	stopAt := recordFrom.Add(lim.Duration)
	var first, last atomic.Int64 // the measured period: first recorded start, last recorded end
	for wi := range workers {
		w := &worker{}
		workers[wi] = w
		wg.Add(1)
		go func(wi int) {
			defer wg.Done()
			for ctx.Err() == nil {
				start := time.Now()
				if !start.Before(stopAt) {
					return
				}
				i := next.Add(1) - 1
				if lim.Requests > 0 && i >= lim.Requests {
					return
				}
				n, err := fn(ctx, wi, i)
				end := time.Now()
				if ctx.Err() != nil {
					return // the caller gave up: not a failure of the target
				}
				record := !start.Before(recordFrom)
				if record {
					first.CompareAndSwap(0, start.UnixNano())
					for l := last.Load(); end.UnixNano() > l && !last.CompareAndSwap(l, end.UnixNano()); l = last.Load() {
					}
				}
				w.done(start, end, n, err, record)
			}
		}(wi)
	}
	wg.Wait()
	var elapsed time.Duration
	if f, l := first.Load(), last.Load(); f != 0 && l > f {
		elapsed = time.Duration(l - f)
	}
	r := collect(name, workers, elapsed)
	r.Mode = fmt.Sprintf("closed loop, concurrency %d", concurrency)
	return r
}

// openLoop sends at a fixed rate, whatever the answers: request i is due at
// start + i/rate, and its latency counts from that intended time, so a slow
// server shows up as latency instead of as a lower send rate (no coordinated
// omission). Up to maxInFlight requests are outstanding; if they are all
// waiting, later requests start late and their latency includes the wait.
func openLoop(ctx context.Context, name string, rate float64, maxInFlight int, lim Limits, fn call) *Report {
	lim = lim.withDefaults()
	if maxInFlight <= 0 {
		maxInFlight = max(64, int(rate/100))
	}
	interval := time.Duration(float64(time.Second) / rate)
	total := int64(lim.Duration / interval)
	warm := int64(lim.Warmup / interval)
	if lim.Requests > 0 && lim.Requests < total {
		total = lim.Requests
	}
	total += warm
	fn = withCallTimeout(ctx, fn)
	workers := make([]*worker, maxInFlight)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now().Add(time.Millisecond)
	for wi := range workers {
		w := &worker{}
		workers[wi] = w
		wg.Add(1)
		go func(wi int) {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				intended := start.Add(time.Duration(i) * interval)
				if d := time.Until(intended); d > 0 {
					time.Sleep(d)
				}
				sent := time.Now()
				record := i >= warm
				if record && sent.Sub(intended) > time.Millisecond {
					w.late++
				}
				n, err := fn(ctx, wi, i)
				end := time.Now()
				if ctx.Err() != nil {
					return
				}
				w.done(intended, end, n, err, record)
			}
		}(wi)
	}
	wg.Wait()
	elapsed := time.Duration(total-warm) * interval
	r := collect(name, workers, elapsed)
	r.Mode = fmt.Sprintf("open loop, %.0f/s", rate)
	if r.Count < total-warm {
		r.Notes = map[string]string{"unsent": fmt.Sprint(total - warm - r.Count)}
	}
	return r
}

// paced calls tick(i) for i = 0, 1, … at rate per second until ctx ends or
// stopAt passes. Ticks keep their schedule from the start: a late tick runs at
// once and the next one is due on time, not one interval after it.
func paced(ctx context.Context, rate float64, stopAt time.Time, tick func(i int)) {
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := 0; ctx.Err() == nil && time.Now().Before(stopAt); i++ {
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		next = next.Add(interval)
		tick(i)
	}
}

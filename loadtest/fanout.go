package loadtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// arrival is one list a WatchRules stream received after its first.
type arrival struct {
	revision int64
	at       time.Time
}

// Fanout opens streams WatchRules streams spread over workloads (many streams
// share a workload, as the firewall agents of one service do), waits until each
// has its first list, writes one policy that changes every workload's inbound
// list, and measures the time from the write until each stream has a list at
// the write's revision or later. Every stream records each list it receives
// with its arrival time, so an update that arrives before the write's
// acknowledgment is measured too. The probe policy is deleted at the end.
func Fanout(ctx context.Context, conns Conns, workloads []resource.Tags, streams int, mesh, typ string, timeout time.Duration) *Report {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	var exited sync.WaitGroup
	defer exited.Wait()
	defer cancel()
	var ready sync.WaitGroup
	arrivals := make([]chan arrival, streams)
	var failures atomic.Int64
	var firstErr atomic.Value
	opened := time.Now()
	for s := 0; s < streams; s++ {
		arrivals[s] = make(chan arrival, 64)
		ready.Add(1)
		exited.Add(1)
		go func(s int) {
			defer exited.Done()
			first := true
			defer func() {
				if first {
					ready.Done()
				}
			}()
			client := verdictv1.NewWatchServiceClient(conns.pick(s))
			st, err := client.WatchRules(ctx, &verdictv1.WatchRulesRequest{Mesh: mesh, Type: typ,
				Workload: &verdictv1.Endpoint{Tags: workloads[s%len(workloads)]}})
			for err == nil {
				var msg *verdictv1.WatchRulesResponse
				if msg, err = st.Recv(); err != nil {
					break
				}
				if first {
					first = false
					ready.Done()
					continue
				}
				select {
				case arrivals[s] <- arrival{msg.Revision, time.Now()}:
				default: // more updates than anyone measures: drop
				}
			}
			if ctx.Err() == nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}(s)
	}
	waitCtx(ctx, &ready)
	readyIn := time.Since(opened)
	r := &Report{Scenario: "fanout", Target: "verdict", Mode: fmt.Sprintf("%d WatchRules streams over %d workloads", streams, len(workloads)),
		Notes: map[string]string{"streams ready in": readyIn.Round(time.Millisecond).String()}}
	if ctx.Err() != nil {
		r.Notes["failed"] = "not every stream got its first list before the timeout"
		return r
	}
	probe := &resource.Policy{Mesh: mesh, Type: typ, Name: fmt.Sprintf("fanout-probe-%d", time.Now().UnixNano()),
		Sources: []resource.Selector{{Match: map[string]string{"fanout": "probe"}}}, Destinations: []resource.Selector{{}},
		Action: resource.Allow}
	res, err := apiconv.ResourceToProto(probe)
	if err != nil {
		panic(err) // a constant policy that does not convert is a bug here
	}
	policies := verdictv1.NewPolicyServiceClient(conns.pick(0))
	writeAt := time.Now()
	resp, err := policies.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{res}})
	if err != nil {
		r.Errors = map[string]int64{"Apply " + codeName(err): 1}
		return r
	}
	key := resource.Key{Kind: resource.KindPolicy, Mesh: mesh, Type: typ, Name: probe.Name}.String()
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_, _ = policies.Delete(dctx, &verdictv1.DeleteRequest{Keys: []string{key}})
	}()
	var h Histogram
	for s := range arrivals {
	wait:
		for {
			select {
			case a := <-arrivals[s]:
				if a.revision >= resp.Revision {
					h.Record(a.at.Sub(writeAt))
					break wait
				}
			case <-ctx.Done():
				break wait
			}
		}
	}
	r.Count = int64(h.Count())
	r.Lags = map[string]Latency{"write → delivered": summarize(&h)}
	r.Notes["delivered"] = fmt.Sprintf("%d of %d streams", h.Count(), streams)
	r.Notes["stream failures"] = fmt.Sprint(failures.Load())
	if e, ok := firstErr.Load().(string); ok {
		r.Notes["first stream error"] = e
	}
	return r
}

// waitCtx waits for wg or ctx, whichever comes first.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

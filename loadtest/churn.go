package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Churn writes policies at writeRate per second while Decide runs: open loop at
// rate calls per second (at most concurrency in flight, 0 picks), or, with rate
// 0, closed loop with concurrency workers — which saturates the machine, so the
// lags then include the queueing of a saturated server. Each write is followed by a Decide with min_revision set to the
// write's revision, which returns once the write is visible to Decide; the
// report's lags are write → acknowledged, acknowledged → visible, and
// write → visible (p50/p99/max). The main latency is Decide's during the churn.
func Churn(ctx context.Context, conns Conns, flows []*verdictv1.DecideRequest, concurrency int, rate, writeRate float64,
	mesh, typ string, lim Limits) *Report {
	lim = lim.withDefaults()
	stopAt := time.Now().Add(lim.Warmup + lim.Duration)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	policies := verdictv1.NewPolicyServiceClient(conns.pick(0))
	decisions := verdictv1.NewDecisionServiceClient(conns.pick(0))
	var ack, visible, total Histogram
	var writeErrors = map[string]int64{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(7, 7))
		paced(wctx, writeRate, stopAt, func(i int) {
			p := &resource.Policy{Mesh: mesh, Type: typ, Name: fmt.Sprintf("churn-%03d", i%100), Action: resource.Allow,
				Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("churn-src-%d", r.IntN(1000))}}},
				Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: fmt.Sprintf("churn-dst-%d", r.IntN(1000))}}}}
			if i%2 == 1 {
				p.Action = resource.Deny
			}
			res, err := apiconv.ResourceToProto(p)
			if err != nil {
				panic(err) // a generated policy that does not convert is a bug here
			}
			cctx, ccancel := context.WithTimeout(wctx, callTimeout)
			t0 := time.Now()
			resp, err := policies.Apply(cctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{res}})
			if err != nil {
				if wctx.Err() == nil {
					writeErrors["Apply "+codeName(err)]++
				}
				ccancel()
				return
			}
			t1 := time.Now()
			probe := proto.Clone(flows[i%len(flows)]).(*verdictv1.DecideRequest)
			probe.MinRevision = resp.Revision
			_, err = decisions.Decide(cctx, probe)
			t2 := time.Now()
			ccancel()
			if err != nil {
				if wctx.Err() == nil {
					writeErrors["Decide(min_revision) "+codeName(err)]++
				}
				return
			}
			ack.Record(t1.Sub(t0))
			visible.Record(t2.Sub(t1))
			total.Record(t2.Sub(t0))
		})
	}()
	r := Unary(ctx, conns, flows, concurrency, rate, lim)
	wg.Wait()
	r.Scenario = "churn"
	r.Mode += fmt.Sprintf(", %.0f writes/s", writeRate)
	r.Lags = map[string]Latency{
		"write → acknowledged":   summarize(&ack),
		"acknowledged → visible": summarize(&visible),
		"write → visible":        summarize(&total),
	}
	r.Notes = map[string]string{"writes": fmt.Sprint(total.Count())}
	for k, v := range writeErrors {
		if r.Errors == nil {
			r.Errors = map[string]int64{}
		}
		r.Errors[k] += v
	}
	return r
}

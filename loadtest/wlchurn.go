package loadtest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// ChurnWorkloads is the inventory of the workload-churn scenario (issue 13
// item 6): n workloads in pairs, pair k being flow k%len(flows)'s source and
// destination tag sets, each workload with one address of 10.64.0.0/10 (apart
// from CheckFlows' 10.128.0.0/9) and a SPIFFE ID. probes are Decide requests by
// address for the first pairs (at most 8192): a flow's mesh, type, protocol and
// port, its source and destination given by their workloads' addresses.
func ChurnWorkloads(flows []engine.Request, n int) (workloads []*resource.Workload, probes []*verdictv1.DecideRequest) {
	if len(flows) == 0 {
		return nil, nil
	}
	workloads = make([]*resource.Workload, n)
	for i := range workloads {
		f := flows[(i/2)%len(flows)]
		mesh, tags := f.Mesh, f.Source
		if mesh == "" {
			mesh = resource.DefaultMesh
		}
		if i%2 == 1 {
			tags = f.Destination
		}
		name := fmt.Sprintf("wl-%d", i)
		workloads[i] = &resource.Workload{Mesh: mesh, Name: name, Tags: maps.Clone(tags),
			Addresses: []string{churnAddr(i)}, Principal: "spiffe://" + mesh + "/" + name}
	}
	for k := 0; k < n/2 && k < 8192; k++ {
		f := flows[k%len(flows)]
		probes = append(probes, &verdictv1.DecideRequest{
			Mesh: f.Mesh, Type: f.Type, Protocol: f.Protocol.String(), Port: f.Port,
			Source:      &verdictv1.Endpoint{Address: workloads[2*k].Addresses[0]},
			Destination: &verdictv1.Endpoint{Address: workloads[2*k+1].Addresses[0]},
		})
	}
	return workloads, probes
}

// churnAddr is workload i's address: 10.64.0.0/10 holds 4M.
func churnAddr(i int) string {
	return netip.AddrFrom4([4]byte{10, 64 | byte(i>>16&63), byte(i >> 8), byte(i)}).String()
}

// answer is what the workload-churn check compares: a decision's action, its
// deciding policy and the workloads the two ends resolved to.
type answer struct {
	action           verdictv1.Action
	policy, src, dst string
}

func answerOf(r *verdictv1.DecideResponse) answer {
	return answer{action: r.GetAction(), policy: r.GetPolicy(),
		src: r.GetSourceResolution().GetWorkload(), dst: r.GetDestinationResolution().GetWorkload()}
}

// maxVisibilityChecks bounds the workload-churn puts whose visibility is
// being awaited at once.
const maxVisibilityChecks = 1024

// WorkloadChurnConfig configures WorkloadChurn.
type WorkloadChurnConfig struct {
	Workloads   []*resource.Workload        // the preloaded inventory (ChurnWorkloads)
	Probes      []*verdictv1.DecideRequest  // Decide by address over the first pairs
	Expected    []*verdictv1.DecideResponse // each probe's answer before the churn
	Concurrency int                         // closed loop workers, or the open loop's in-flight bound (0 picks)
	Rate        float64                     // Decide calls/s; 0: closed loop
	PutRate     float64                     // workload puts/s
	Writers     int                         // goroutines making the puts (each waits for its put's acknowledgement)
	Limits      Limits
}

// WorkloadChurn puts workloads at PutRate per second while Decide runs by
// address over the same inventory (open loop at Rate, or closed loop). A put
// rewrites one preloaded workload of a probed pair with the same tags,
// addresses and ports and a new principal — it changes no tag set, so no
// decision may change and the decision memo has no reason to go cold. After a
// put returns revision R, the pair's probe is sent with min_revision R: it
// returns once the put is visible. The lags are put → acknowledged,
// acknowledged → visible and put → visible; every answer (the probes' and,
// sampled, the load's) is compared with the one taken before the churn, and a
// difference counts as the error "wrong answer". Puts are paced by one ticker
// and made by Writers goroutines, each waiting for its put's acknowledgement
// only: the probe that awaits the put's visibility runs beside it (at most
// maxVisibilityChecks at once), so the visibility lag does not bound the put
// rate. A tick that finds every writer busy is skipped and counted (note
// "puts skipped"), so the writes stay bounded.
func WorkloadChurn(ctx context.Context, conns Conns, cfg WorkloadChurnConfig) *Report {
	lim := cfg.Limits.withDefaults()
	stopAt := time.Now().Add(lim.Warmup + lim.Duration)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var ack, visible, total Histogram
	putErrors := map[string]int64{}
	fail := func(k string) {
		mu.Lock()
		putErrors[k]++
		mu.Unlock()
	}
	var skipped, gen atomic.Int64
	ticks := make(chan int, cfg.Writers)
	var wg, checks sync.WaitGroup
	// Visibility is awaited beside the writers, so that a writer's next put
	// does not wait for its last one to be visible: at most maxVisibilityChecks
	// in flight (then a writer waits for one to end).
	inFlight := make(chan struct{}, maxVisibilityChecks)
	for w := 0; w < cfg.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			policies := verdictv1.NewPolicyServiceClient(conns.pick(w))
			decisions := verdictv1.NewDecisionServiceClient(conns.pick(w))
			for i := range ticks {
				k := i % len(cfg.Probes)
				orig := cfg.Workloads[2*k+i/len(cfg.Probes)%2]
				wl := *orig
				wl.Principal = fmt.Sprintf("%s/g%d", orig.Principal, gen.Add(1))
				cctx, ccancel := context.WithTimeout(wctx, callTimeout)
				t0 := time.Now()
				resp, err := policies.Apply(cctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{apiconv.WorkloadToProto(&wl)}})
				if err != nil {
					if wctx.Err() == nil {
						fail("Apply " + codeName(err))
					}
					ccancel()
					continue
				}
				t1 := time.Now()
				probe := proto.Clone(cfg.Probes[k]).(*verdictv1.DecideRequest)
				probe.MinRevision = resp.Revision
				select {
				case inFlight <- struct{}{}:
				case <-wctx.Done():
					ccancel()
					continue
				}
				checks.Go(func() {
					defer func() { <-inFlight }()
					defer ccancel()
					got, err := decisions.Decide(cctx, probe)
					t2 := time.Now()
					if err != nil {
						if wctx.Err() == nil {
							fail("Decide(min_revision) " + codeName(err))
						}
						return
					}
					if answerOf(got) != answerOf(cfg.Expected[k]) {
						fail("wrong answer")
					}
					mu.Lock()
					ack.Record(t1.Sub(t0))
					visible.Record(t2.Sub(t1))
					total.Record(t2.Sub(t0))
					mu.Unlock()
				})
			}
		}()
	}
	go func() {
		defer close(ticks)
		paced(wctx, cfg.PutRate, stopAt, func(i int) {
			select {
			case ticks <- i:
			default:
				skipped.Add(1)
			}
		})
	}()

	// The load: Decide by address over the probes; one call in 16 is checked
	// against the answer before the churn.
	clients := make([]verdictv1.DecisionServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = verdictv1.NewDecisionServiceClient(c)
	}
	fn := func(ctx context.Context, w int, i int64) (int, error) {
		k := int(i % int64(len(cfg.Probes)))
		got, err := clients[w%len(clients)].Decide(ctx, cfg.Probes[k])
		if err == nil && i%16 == 0 && answerOf(got) != answerOf(cfg.Expected[k]) {
			fail("wrong answer")
		}
		return 1, err
	}
	var r *Report
	if cfg.Rate > 0 {
		r = openLoop(ctx, "workload-churn", cfg.Rate, cfg.Concurrency, lim, fn)
	} else {
		r = closedLoop(ctx, "workload-churn", cfg.Concurrency, lim, fn)
	}
	wg.Wait()
	checks.Wait()
	r.Scenario = "workload-churn"
	r.Mode += fmt.Sprintf(", %.0f workload puts/s by %d writers, %d workloads", cfg.PutRate, cfg.Writers, len(cfg.Workloads))
	r.Lags = map[string]Latency{
		"put → acknowledged":     summarize(&ack),
		"acknowledged → visible": summarize(&visible),
		"put → visible":          summarize(&total),
	}
	r.Notes = map[string]string{"puts": fmt.Sprint(total.Count()), "puts skipped": fmt.Sprint(skipped.Load()),
		"memo misses": "counted for the compact path only (verdict_decision_memo_lookups_total); this scenario decides by address"}
	for k, v := range putErrors {
		if r.Errors == nil {
			r.Errors = map[string]int64{}
		}
		r.Errors[k] += v
	}
	return r
}

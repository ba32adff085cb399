package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Conns is a pool of client connections to one target; workers spread over it.
type Conns []*grpc.ClientConn

func (c Conns) pick(i int) *grpc.ClientConn { return c[i%len(c)] }

// Flows converts engine requests to API requests once, before a run.
func Flows(reqs []engine.Request) []*verdictv1.DecideRequest {
	out := make([]*verdictv1.DecideRequest, len(reqs))
	for i, r := range reqs {
		out[i] = &verdictv1.DecideRequest{
			Mesh: r.Mesh, Type: r.Type, Protocol: r.Protocol.String(), Port: r.Port,
			Source:      &verdictv1.Endpoint{Tags: r.Source},
			Destination: &verdictv1.Endpoint{Tags: r.Destination},
		}
	}
	return out
}

// Unary runs Decide: closed loop with concurrency workers, or open loop at rate
// calls per second when rate > 0.
func Unary(ctx context.Context, conns Conns, flows []*verdictv1.DecideRequest, concurrency int, rate float64, lim Limits) *Report {
	clients := make([]verdictv1.DecisionServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = verdictv1.NewDecisionServiceClient(c)
	}
	fn := func(ctx context.Context, w int, i int64) (int, error) {
		_, err := clients[w%len(clients)].Decide(ctx, flows[i%int64(len(flows))])
		return 1, err
	}
	if rate > 0 {
		return openLoop(ctx, "open", rate, concurrency, lim, fn)
	}
	return closedLoop(ctx, "unary", concurrency, lim, fn)
}

// Batch runs DecideBatch with size flows per call, closed loop.
func Batch(ctx context.Context, conns Conns, flows []*verdictv1.DecideRequest, concurrency, size int, lim Limits) *Report {
	clients := make([]verdictv1.DecisionServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = verdictv1.NewDecisionServiceClient(c)
	}
	batches := make([]*verdictv1.DecideBatchRequest, 0, len(flows)/size+1)
	for i := 0; i+size <= len(flows); i += size {
		batches = append(batches, &verdictv1.DecideBatchRequest{Requests: flows[i : i+size]})
	}
	if len(batches) == 0 {
		batches = append(batches, &verdictv1.DecideBatchRequest{Requests: flows})
	}
	r := closedLoop(ctx, "batch", concurrency, lim, func(ctx context.Context, w int, i int64) (int, error) {
		b := batches[i%int64(len(batches))]
		resp, err := clients[w%len(clients)].DecideBatch(ctx, b)
		if err != nil {
			return 0, err
		}
		return len(resp.Results), nil
	})
	r.Mode += fmt.Sprintf(", %d flows per call", size)
	return r
}

// Stream runs DecideStream: streams streams, each keeping window requests in
// flight. Latency is per flow, from its send to its answer.
func Stream(ctx context.Context, conns Conns, flows []*verdictv1.DecideRequest, streams, window int, lim Limits) *Report {
	lim = lim.withDefaults()
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, lim.Warmup+lim.Duration)
	defer cancel()
	workers := make([]*worker, streams)
	var wg sync.WaitGroup
	var firstRecorded atomic.Int64
	recordFrom := time.Now().Add(lim.Warmup)
	var total, lastAnswer atomic.Int64
	for s := 0; s < streams; s++ {
		w := &worker{}
		workers[s] = w
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			client := verdictv1.NewDecisionServiceClient(conns.pick(s))
			// The stream carries no deadline: the run's time limit is the
			// client's to enforce (stop sending, close, drain). With the
			// deadline on the stream the server could end it with
			// DEADLINE_EXCEEDED a moment before the client notices its own
			// limit, and that would count as a failure of the target.
			sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
			defer scancel()
			stopOnCancel := context.AfterFunc(outer, scancel) // the caller giving up still ends it
			defer stopOnCancel()
			st, err := client.DecideStream(sctx)
			if err != nil {
				w.done(time.Now(), time.Now(), 0, err, true)
				return
			}
			sent := make([]atomic.Int64, window) // send time per slot, unix ns
			slots := make(chan int, window)
			for i := 0; i < window; i++ {
				slots <- i
			}
			recvDone := make(chan struct{})
			go func() {
				defer close(recvDone)
				for {
					resp, err := st.Recv()
					if err != nil {
						if !errors.Is(err, io.EOF) && ctx.Err() == nil {
							w.done(time.Now(), time.Now(), 0, err, true)
						}
						return
					}
					slot, _ := strconv.Atoi(resp.Id)
					now := time.Now()
					start := time.Unix(0, sent[slot].Load())
					record := !start.Before(recordFrom)
					if record {
						firstRecorded.CompareAndSwap(0, start.UnixNano())
					}
					var rerr error
					if e := resp.GetResult().GetError(); e != nil {
						rerr = fmt.Errorf("%s: %s", e.Code, e.Message)
					}
					w.done(start, now, 1, rerr, record)
					lastAnswer.Store(now.UnixNano())
					slots <- slot
				}
			}()
			ids := make([]string, window)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			for i := int64(s); ; i += int64(streams) {
				var slot int
				select {
				case slot = <-slots:
				case <-ctx.Done():
				}
				if ctx.Err() != nil || (lim.Requests > 0 && total.Add(1) > lim.Requests) {
					break
				}
				sent[slot].Store(time.Now().UnixNano())
				if err := st.Send(&verdictv1.DecideStreamRequest{Id: ids[slot], Request: flows[i%int64(len(flows))]}); err != nil {
					break
				}
			}
			_ = st.CloseSend()
			// Drain what is in flight, briefly.
			select {
			case <-recvDone:
			case <-time.After(2 * time.Second):
				scancel()
				<-recvDone
			}
		}(s)
	}
	wg.Wait()
	elapsed := time.Duration(0)
	if f, l := firstRecorded.Load(), lastAnswer.Load(); f != 0 && l > f {
		elapsed = time.Duration(l - f)
	}
	r := collect("stream", workers, elapsed)
	r.Mode = fmt.Sprintf("%d streams, window %d", streams, window)
	return r
}

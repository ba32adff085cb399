package server

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// BenchmarkDecideDecisionLog compares unary Decide over bufconn with the
// decision log off and on (every decision logged as a JSON line to a
// discarding writer, the queue large enough that none is dropped), same run:
// the target is "on" ≤ 5% slower. The dropped records are reported beside.
// "repeats" logs with the repeat window on: the one flow decided again and
// again is counted, not written.
//
//	go test -run '^$' -bench DecideDecisionLog -benchtime 3s -count 5 ./server/
func BenchmarkDecideDecisionLog(b *testing.B) {
	var resources string
	for i := range 100 {
		resources += fmt.Sprintf("---\nkind: Policy\nname: p%d\nsources: [{match: {app: s%d}}]\ndestinations: [{match: {app: d%d}}]\n", i, i, i)
	}
	be := newBackend(decodeYAML(b, resources)...)
	req := &verdictv1.DecideRequest{Source: tags("app", "s7", "env", "prod"), Destination: tags("app", "d7", "env", "prod"),
		Protocol: "TCP", Port: 443}
	for _, name := range []string{"off", "on", "repeats"} {
		b.Run(name, func(b *testing.B) {
			var l *decisionlog.Logger
			if name != "off" {
				window := time.Duration(-1) // every decision written
				if name == "repeats" {
					window = 0 // the default
				}
				var err error
				l, err = decisionlog.New(decisionlog.Config{QueueSize: 1 << 20, RepeatWindow: window,
					Sinks: []decisionlog.Sink{decisionlog.NewJSONLines(io.Discard, nil)}})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- l.Run(ctx) }()
				defer func() {
					cancel()
					<-done
				}()
			}
			h := start(b, be, func(c *Config) { c.DecisionLog = l })
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := h.dec.Decide(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if l != nil {
				st := l.Stats()
				b.ReportMetric(float64(st.Dropped), "dropped")
			}
		})
	}
}

// BenchmarkDecisionLogThroughput: records per second one logger writes to a
// JSON-lines sink (io.Discard), offered as fast as the writer takes them.
func BenchmarkDecisionLogThroughput(b *testing.B) {
	l, err := decisionlog.New(decisionlog.Config{QueueSize: 1 << 16, FlushInterval: time.Millisecond, Sinks: []decisionlog.Sink{decisionlog.NewJSONLines(io.Discard, nil)}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	r := &decisionlog.Record{Time: timestamppb.Now(), Rpc: "Decide", Revision: 42, Mesh: "default", Type: "TrafficPermission",
		Source:      &verdictv1.RecordEndpoint{Tags: map[string]string{"app": "web", "env": "prod"}},
		Destination: &verdictv1.RecordEndpoint{Tags: map[string]string{"app": "db"}},
		Protocol:    "TCP", Port: 5432, Action: "DENY", Policy: "deny-db",
		Outbound: &verdictv1.RecordSide{Action: "DENY", Policy: "deny-db", Rule: "sources[0]/destinations[0]", Reason: "MATCHED"},
		Inbound:  &verdictv1.RecordSide{Action: "DENY", Policy: "deny-db", Rule: "sources[0]/destinations[0]", Reason: "MATCHED"}}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for l.Stats().QueueDepth > 1<<15 { // offer no faster than it writes: nothing dropped
			time.Sleep(50 * time.Microsecond)
		}
		l.Log(0, r)
	}
	for l.Stats().Written+l.Stats().Dropped < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	b.ReportMetric(float64(l.Stats().Dropped), "dropped")
	cancel()
	<-done
}

package server

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// BenchmarkDecideRecorder is one decision handed to the recorder, without
// gRPC: the decision log off; on with every decision written (a new flow
// each time, the repeats off); and on with one hot flow, counted as repeats.
// The log's goroutine (encoding to io.Discard) shares the CPU with it.
//
//	go test -run '^$' -bench DecideRecorder -benchtime 1s -count 5 ./server/
func BenchmarkDecideRecorder(b *testing.B) {
	var resources string
	for i := range 100 {
		resources += fmt.Sprintf("---\nkind: Policy\nname: p%d\nsources: [{match: {app: s%d}}]\ndestinations: [{match: {app: d%d}}]\n", i, i, i)
	}
	be := newBackend(decodeYAML(b, resources)...)
	for _, mode := range []string{"off", "on", "on-hot"} {
		b.Run(mode, func(b *testing.B) {
			var l *decisionlog.Logger
			if mode != "off" {
				var err error
				window := time.Duration(0) // the default
				if mode == "on" {
					window = -1 // every decision written
				}
				l, err = decisionlog.New(decisionlog.Config{QueueSize: 1 << 22, RepeatWindow: window,
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
			s := h.srv.decision
			snap := s.current()
			req := &verdictv1.DecideRequest{Source: tags("app", "s7", "env", "prod"), Destination: tags("app", "d7", "env", "prod"),
				Protocol: "TCP", Port: 443}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if mode == "on" {
					req.Port = uint32(1 + i%60000)
				}
				er, err := decideRequest(req)
				if err != nil {
					b.Fatal(err)
				}
				var t tally
				if _, err := s.decide(ctx, &t, snap, &er, new(apiconv.DecideAnswer)); err != nil {
					b.Fatal(err)
				}
				s.record.done(ctx, &t)
			}
			b.StopTimer()
			if l != nil {
				b.ReportMetric(float64(l.Stats().Dropped), "dropped")
			}
		})
	}
}

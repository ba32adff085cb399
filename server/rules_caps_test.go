package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestWatchRulesCaps: WatchRules streams over a cap — per connection, per
// caller, on the server — are refused with RESOURCE_EXHAUSTED naming the cap
// (nothing else bounded them: no token is needed); a stream that ends frees
// its place.
func TestWatchRulesCaps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     func(*Config)
		conns   []int // streams opened on each connection, in order; the last one is refused
		message string
	}{
		{"per connection", func(c *Config) { c.RulesMaxStreamsPerConn = 2 }, []int{1, 3}, "2 open on this connection, the limit per connection"},
		{"per caller", func(c *Config) { c.RulesMaxStreamsPerConn, c.RulesMaxStreamsPerCaller = 2, 3 }, []int{2, 1, 1},
			"3 open by caller bufconn, the limit per caller"},
		{"on the server", func(c *Config) { c.RulesMaxStreamsPerConn, c.RulesMaxStreamsPerCaller, c.RulesMaxStreams = 2, 2, 2 }, []int{1, 1, 1},
			"2 open on this server, its limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, newBackend(decodeYAML(t, testPolicies)...), tc.cfg)
			ctx := ctxT(t)
			var cancels []context.CancelFunc
			open := func(w verdictv1.WatchServiceClient) error {
				sctx, cancel := context.WithCancel(ctx)
				cancels = append(cancels, cancel)
				s, err := w.WatchRules(sctx, &verdictv1.WatchRulesRequest{Workload: tags("app", "web")})
				if err == nil {
					_, err = s.Recv()
				}
				return err
			}
			var last verdictv1.WatchServiceClient
			for i, n := range tc.conns {
				last = verdictv1.NewWatchServiceClient(h.dial())
				for j := range n {
					err := open(last)
					if i < len(tc.conns)-1 || j < n-1 {
						if err != nil {
							t.Fatalf("connection %d stream %d: %v", i, j, err)
						}
						continue
					}
					st := wantCode(t, err, codes.ResourceExhausted)
					if !strings.Contains(st.Message(), tc.message) {
						t.Errorf("message %q, want it to say %q", st.Message(), tc.message)
					}
				}
			}
			// A stream that ends frees its place (the last admitted: on the
			// last connection, of the one caller).
			cancels[len(cancels)-2]()
			for h.srv.hub.Stats().Streams != len(cancels)-2 {
				if ctx.Err() != nil {
					t.Fatalf("%d streams registered", h.srv.hub.Stats().Streams)
				}
				time.Sleep(time.Millisecond)
			}
			deadline := time.Now().Add(time.Minute)
			for err := open(last); err != nil; err = open(last) {
				if time.Now().After(deadline) { // the count is released just after the stream leaves the hub
					t.Fatalf("after a stream ended: %v", err)
				}
				time.Sleep(time.Millisecond)
			}
			for _, c := range cancels {
				c()
			}
		})
	}
}

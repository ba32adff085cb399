package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/internal/netnstest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// fakeRules is a WatchService whose WatchRules streams send what the test
// publishes: the current RULES message first, then every message published
// (RULES or SET_DELTAS). It stands for verdictd where the test needs to
// control the stream itself (fail static, deltas, unreadable messages).
type fakeRules struct {
	verdictv1.UnimplementedWatchServiceServer
	mu      sync.Mutex
	current *verdictv1.WatchRulesResponse
	subs    map[chan *verdictv1.WatchRulesResponse]bool
}

func (f *fakeRules) WatchRules(req *verdictv1.WatchRulesRequest, s grpc.ServerStreamingServer[verdictv1.WatchRulesResponse]) error {
	ch := make(chan *verdictv1.WatchRulesResponse, 16)
	f.mu.Lock()
	cur := f.current
	f.subs[ch] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}()
	if cur != nil {
		if err := s.Send(cur); err != nil {
			return err
		}
	}
	for {
		select {
		case <-s.Context().Done():
			return nil
		case m := <-ch:
			if err := s.Send(m); err != nil {
				return err
			}
		}
	}
}

// publish sends m to every stream; a RULES message becomes the current one.
func (f *fakeRules) publish(m *verdictv1.WatchRulesResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.GetKind() != verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS {
		f.current = m
	}
	for ch := range f.subs {
		ch <- m
	}
}

// serve runs a gRPC server of f on addr ("127.0.0.1:0" for any port).
func serveFake(t *testing.T, f *fakeRules, addr string) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	verdictv1.RegisterWatchServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	var once sync.Once
	stop := func() { once.Do(srv.Stop) }
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// eventually polls cond until it holds or a generous deadline passes (a
// busy machine may be slow: a deadline, never a timing).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within the deadline: %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// bRules are workload b's rules: inbound TCP 8080 from the set aclients
// (action act), everything else to b dropped; outbound allowed.
func bRules(rev int64, act verdictv1.Action, clients []string, addrs ...string) *verdictv1.WatchRulesResponse {
	return &verdictv1.WatchRulesResponse{Revision: rev, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES,
		WorkloadAddresses: addrs,
		Sets:              []*verdictv1.AddressSet{{Name: "aclients", Addresses: clients}},
		Inbound: &verdictv1.SideRules{Combine: "FirstMatch", Fallback: verdictv1.Action_ACTION_DENY, Rules: []*verdictv1.Rule{{
			Policy: "clients-to-b", Rule: "sources[0]/destinations[0]", PeerSets: []string{"aclients"}, Action: act,
			Ports: []*verdictv1.PortEntry{{Protocol: "TCP", Ports: "8080"}}}}},
		Outbound: &verdictv1.SideRules{Combine: "FirstMatch", Fallback: verdictv1.Action_ACTION_ALLOW},
	}
}

func startAgent(t *testing.T, ctx context.Context, tp *netnstest.Topo, server string) (*Agent, func()) {
	t.Helper()
	cfg := Config{Server: server, NoAuth: true, Workloads: []string{"b"}, Table: "verdict-agent-test",
		Initial: InitialDrop, NetNS: "/run/netns/" + tp.H, BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		LogLevel: "info"}
	a, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return a, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		a.Close()
	}
}

// TestAgentEnforcesTheStream drives the agent with a stream the test
// controls and checks real packets between two namespaces routed by a third
// (where the agent's table is): allowed, dropped, flipped, an established
// connection cut, set deltas, a workload moving address, fail static while
// the stream is down, and a restart.
func TestAgentEnforcesTheStream(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.NewTopo(t)
	netnstest.IP(t, "-n", tp.B, "addr", "add", "10.250.2.3/24", "dev", tp.Dev[2])
	netnstest.Echo(t, tp.B, "0.0.0.0:8080")
	netnstest.Echo(t, tp.B, "0.0.0.0:9090")
	const b8080, b9090 = "10.250.2.2:8080", "10.250.2.2:9090"
	if !netnstest.Connects(t, tp.A, b8080) || !netnstest.Connects(t, tp.A, b9090) {
		t.Fatal("the topology does not route before any firewall")
	}
	ctx := t.Context()
	f := &fakeRules{subs: map[chan *verdictv1.WatchRulesResponse]bool{}}
	f.publish(bRules(1, verdictv1.Action_ACTION_ALLOW, []string{"10.250.1.2"}, "10.250.2.2"))
	addr, stopServer := serveFake(t, f, "127.0.0.1:0")
	a, stopAgent := startAgent(t, ctx, tp, addr)

	eventually(t, "the first rules programmed", func() bool {
		return testutil.ToFloat64(a.m.revision.WithLabelValues("workload/b")) == 1
	})
	if out, err := exec.Command("ip", "netns", "exec", tp.H, "nft", "list", "table", "inet", "verdict-agent-test").CombinedOutput(); err == nil {
		t.Logf("the agent's table (nft list):\n%s", out) // docs/agent.md's excerpt; nft is optional
	}
	if !netnstest.Connects(t, tp.A, b8080) {
		t.Error("allowed: a → b:8080 does not connect")
	}
	if !netnstest.Blocked(t, tp.A, b9090) {
		t.Error("the fallback DENY: a → b:9090 connects")
	}

	// An established connection is cut when its rule turns to DENY.
	c, err := netnstest.Dial(t, tp.A, b8080, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := netnstest.RoundTrip(c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f.publish(bRules(2, verdictv1.Action_ACTION_DENY, []string{"10.250.1.2"}, "10.250.2.2"))
	eventually(t, "the DENY programmed", func() bool {
		return testutil.ToFloat64(a.m.revision.WithLabelValues("workload/b")) == 2
	})
	if err := netnstest.RoundTrip(c, 2*time.Second); err == nil {
		t.Error("an established connection still echoes after its rule turned to DENY")
	}
	if !netnstest.Blocked(t, tp.A, b8080) {
		t.Error("a new connection passes the DENY")
	}
	f.publish(bRules(3, verdictv1.Action_ACTION_ALLOW, []string{"10.250.1.2"}, "10.250.2.2"))
	// The revision is set after the apply is counted: reading the count
	// before it could miss rev 3's own full apply.
	eventually(t, "ALLOW again programmed", func() bool {
		return testutil.ToFloat64(a.m.revision.WithLabelValues("workload/b")) == 3
	})
	eventually(t, "ALLOW again: a → b:8080 connects", func() bool { return netnstest.Connects(t, tp.A, b8080) })

	// Membership alone: set elements only.
	full := testutil.ToFloat64(a.m.applies.WithLabelValues("full"))
	f.publish(&verdictv1.WatchRulesResponse{Revision: 4, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS,
		SetDeltas: []*verdictv1.AddressSetDelta{{Name: "aclients", Removed: []string{"10.250.1.2"}, Added: []string{"10.250.3.9"}}}})
	eventually(t, "a removed from the peer set: blocked", func() bool { return netnstest.Blocked(t, tp.A, b8080) })
	f.publish(&verdictv1.WatchRulesResponse{Revision: 5, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS,
		SetDeltas: []*verdictv1.AddressSetDelta{{Name: "aclients", Added: []string{"10.250.1.0/24"}}}})
	eventually(t, "a's network added to the peer set: connects", func() bool { return netnstest.Connects(t, tp.A, b8080) })
	if got := testutil.ToFloat64(a.m.applies.WithLabelValues("full")); got != full {
		t.Errorf("set deltas replaced the table whole (%v full applies, %v before)", got, full)
	}

	// b moves to 10.250.2.3: its rules follow it; its old address is no
	// longer b's and no longer guarded.
	f.publish(bRules(6, verdictv1.Action_ACTION_ALLOW, []string{"10.250.1.2"}, "10.250.2.3"))
	eventually(t, "b's rules at its new address", func() bool { return netnstest.Blocked(t, tp.A, "10.250.2.3:9090") })
	if !netnstest.Connects(t, tp.A, "10.250.2.3:8080") {
		t.Error("allowed at b's new address: a → b:8080 does not connect")
	}
	if !netnstest.Connects(t, tp.A, b9090) {
		t.Error("b's old address is still guarded by b's rules")
	}

	// verdictd lost: the last rules stay, and the metrics say so.
	stopServer()
	eventually(t, "fail static in the metrics", func() bool {
		return testutil.ToFloat64(a.m.failStatic.WithLabelValues("workload/b")) == 1 &&
			testutil.ToFloat64(a.m.connected.WithLabelValues("workload/b")) == 0
	})
	if !netnstest.Connects(t, tp.A, "10.250.2.3:8080") || !netnstest.Blocked(t, tp.A, "10.250.2.3:9090") {
		t.Error("fail static: the last rules are not in force")
	}
	// verdictd back (same address) with changed rules: the agent resumes.
	f.publish(bRules(7, verdictv1.Action_ACTION_DENY, []string{"10.250.1.2"}, "10.250.2.3"))
	serveFake(t, f, addr)
	eventually(t, "reconnected: the new rules in force", func() bool {
		return testutil.ToFloat64(a.m.revision.WithLabelValues("workload/b")) == 7 &&
			testutil.ToFloat64(a.m.failStatic.WithLabelValues("workload/b")) == 0
	})
	if !netnstest.Blocked(t, tp.A, "10.250.2.3:8080") {
		t.Error("after the reconnect: the DENY is not in force")
	}

	// A message the agent cannot read is refused: the last rules stay.
	bad := bRules(8, verdictv1.Action_ACTION_ALLOW, []string{"not-an-address"}, "10.250.2.3")
	f.publish(bad)
	eventually(t, "the unreadable message counted", func() bool {
		return testutil.ToFloat64(a.m.msgErrs.WithLabelValues("workload/b")) > 0
	})
	if !netnstest.Blocked(t, tp.A, "10.250.2.3:8080") {
		t.Error("an unreadable ALLOW replaced the DENY")
	}

	// A restarted agent replaces its table whole and enforces the same.
	f.publish(bRules(9, verdictv1.Action_ACTION_ALLOW, []string{"10.250.1.2"}, "10.250.2.3"))
	stopAgent()
	a2, stopAgent2 := startAgent(t, ctx, tp, addr)
	defer stopAgent2()
	eventually(t, "the restarted agent applied", func() bool {
		return testutil.ToFloat64(a2.m.revision.WithLabelValues("workload/b")) == 9
	})
	if testutil.ToFloat64(a2.m.applies.WithLabelValues("full")) < 1 {
		t.Error("the restarted agent did not replace its table whole")
	}
	if !netnstest.Connects(t, tp.A, "10.250.2.3:8080") || !netnstest.Blocked(t, tp.A, "10.250.2.3:9090") {
		t.Error("after a restart the rules are not the same")
	}
	if err := a2.Remove(); err != nil {
		t.Fatal(err)
	}
	if !netnstest.Connects(t, tp.A, "10.250.2.3:9090") {
		t.Error("the table removed, traffic still blocked")
	}
}

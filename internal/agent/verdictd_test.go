package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/internal/dial"
	"github.com/verdictpdp/verdict/internal/netnstest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

const e2eToken = "agent-e2e-token"

// verdictd runs the server in-process over an embedded etcd, with a token
// (address sets need an authorized caller), on loopback. It returns its
// address and an authorized client connection.
func verdictd(t *testing.T, ctx context.Context) (string, *grpc.ClientConn) {
	t.Helper()
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), Fast: true, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	synced, served := make(chan error, 1), make(chan error, 1)
	go func() { synced <- sy.Run(sctx) }()
	srv, err := server.New(server.Config{Syncer: sy, Store: st, Token: e2eToken,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { served <- srv.Serve(sctx, lis) }()
	t.Cleanup(func() {
		stop()
		for _, ch := range []chan error{served, synced} {
			if err := <-ch; err != nil && !errors.Is(err, context.Canceled) {
				t.Logf("verdictd: %v", err)
			}
		}
	})
	opts, err := dial.Options{Server: lis.Addr().String(), Token: e2eToken}.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return lis.Addr().String(), conn
}

func workload(name, app string, addrs ...string) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Workload{Workload: &verdictv1.Workload{
		Mesh: "default", Name: name, Tags: map[string]string{"app": app}, Addresses: addrs}}}
}

func aToB(action string) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: &verdictv1.Policy{
		Mesh: "default", Name: "a-to-b", Action: action,
		Sources:      []*verdictv1.Selector{{Match: map[string]string{"app": "a"}}},
		Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "b"}}},
		Ports:        []*verdictv1.PortEntry{{Protocol: "TCP", Ports: "8080"}}}}}
}

// TestAgentWithVerdictd: verdictd (in-process, embedded etcd, a token)
// holds workloads a and b and a policy a → b TCP 8080; the agent guards
// both by name and programs the namespace that routes between them. Real
// TCP is allowed and dropped as Decide answers for the same flows; a policy
// change flips them, cuts an established connection, and b moving address
// keeps its rules (and a's outbound set follows it).
func TestAgentWithVerdictd(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.NewTopo(t)
	netnstest.IP(t, "-n", tp.B, "addr", "add", "10.250.2.3/24", "dev", tp.Dev[2])
	netnstest.Echo(t, tp.B, "0.0.0.0:8080")
	netnstest.Echo(t, tp.B, "0.0.0.0:9090")
	ctx := t.Context()
	addr, conn := verdictd(t, ctx)
	pol := verdictv1.NewPolicyServiceClient(conn)
	dec := verdictv1.NewDecisionServiceClient(conn)
	var rev int64 // of the last apply: Decide answers from a snapshot at least as new
	apply := func(rs ...*verdictv1.Resource) {
		t.Helper()
		r, err := pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: rs})
		if err != nil {
			t.Fatal(err)
		}
		rev = r.GetRevision()
	}
	apply(&verdictv1.Resource{Resource: &verdictv1.Resource_Mesh{Mesh: &verdictv1.Mesh{Name: "default", DefaultAction: "DENY"}}},
		workload("a", "a", "10.250.1.2"), workload("b", "b", "10.250.2.2"), aToB("ALLOW"))
	decide := func(port uint32) verdictv1.Action {
		t.Helper()
		// By the workloads' tags (Decide's workload form is issue 13's; the
		// tags are what it resolves to).
		r, err := dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: map[string]string{"app": "a"}},
			Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": "b"}}, Protocol: "TCP", Port: port, MinRevision: rev})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetAction()
	}

	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(e2eToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Server: addr, TokenFile: tok, Workloads: []string{"a", "b"}, Table: "verdict-e2e",
		Initial: InitialDrop, NetNS: "/run/netns/" + tp.H, BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second, LogLevel: "info"}
	a, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() {
		stopAgent()
		<-done
		a.Close()
	})
	eventually(t, "both workloads' rules programmed", func() bool {
		return testutil.ToFloat64(a.m.connected.WithLabelValues("workload/a")) == 1 &&
			testutil.ToFloat64(a.m.connected.WithLabelValues("workload/b")) == 1 &&
			testutil.ToFloat64(a.m.applies.WithLabelValues("full")) > 0
	})
	// Packets as Decide says for the same flows.
	check := func(dst string, port uint32, wantAllow bool) {
		t.Helper()
		if got := decide(port) == verdictv1.Action_ACTION_ALLOW; got != wantAllow {
			t.Fatalf("Decide a → b:%d allows=%v, want %v", port, got, wantAllow)
		}
		target := net.JoinHostPort(dst, strconv.FormatUint(uint64(port), 10))
		if wantAllow {
			eventually(t, "a → "+target+" connects", func() bool { return netnstest.Connects(t, tp.A, target) })
		} else {
			eventually(t, "a → "+target+" is dropped", func() bool { return netnstest.Blocked(t, tp.A, target) })
		}
	}
	check("10.250.2.2", 8080, true)
	check("10.250.2.2", 9090, false)

	// The policy turns to DENY: new connections dropped, an established one cut.
	c, err := netnstest.Dial(t, tp.A, "10.250.2.2:8080", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := netnstest.RoundTrip(c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	apply(aToB("DENY"))
	check("10.250.2.2", 8080, false)
	if err := netnstest.RoundTrip(c, 2*time.Second); err == nil {
		t.Error("an established connection still echoes after its policy turned to DENY")
	}
	apply(aToB("ALLOW"))
	check("10.250.2.2", 8080, true)

	// b moves to 10.250.2.3: its chains follow it, and a's outbound peer set
	// (b's addresses) follows too, by set deltas.
	apply(workload("b", "b", "10.250.2.3"))
	check("10.250.2.3", 8080, true)
	check("10.250.2.3", 9090, false)
	if testutil.ToFloat64(a.m.applies.WithLabelValues("elements")) == 0 {
		t.Log("no element-only apply: the server sent b's move as RULES only") // a report, not a failure
	}
}

// TestAgentByInterfaces: the agent runs for workload b's own namespace and
// guards the addresses of its interface (WatchRules by address; the input
// and output hooks): 10.250.2.2 is b's and gets b's rules, 10.250.2.3 is no
// workload's and gets the rules of {ip: 10.250.2.3} (here: none, the mesh's
// DENY).
func TestAgentByInterfaces(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.NewTopo(t)
	netnstest.IP(t, "-n", tp.B, "addr", "add", "10.250.2.3/24", "dev", tp.Dev[2])
	netnstest.Echo(t, tp.B, "0.0.0.0:8080")
	netnstest.Echo(t, tp.B, "0.0.0.0:9090")
	got, err := localAddrs("/run/netns/"+tp.B, []string{tp.Dev[2]})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].String() != "10.250.2.2" || got[1].String() != "10.250.2.3" {
		t.Fatalf("the interface's addresses: %v", got)
	}
	ctx := t.Context()
	addr, conn := verdictd(t, ctx)
	_, err = verdictv1.NewPolicyServiceClient(conn).Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
		{Resource: &verdictv1.Resource_Mesh{Mesh: &verdictv1.Mesh{Name: "default", DefaultAction: "DENY"}}},
		workload("a", "a", "10.250.1.2"), workload("b", "b", "10.250.2.2"), aToB("ALLOW")}})
	if err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(e2eToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Server: addr, TokenFile: tok, Interfaces: []string{tp.Dev[2]}, InterfaceRescan: time.Second,
		Table: "verdict-e2e", Initial: InitialDrop, NetNS: "/run/netns/" + tp.B,
		BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second, LogLevel: "info"}
	a, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() {
		stopAgent()
		<-done
		a.Close()
	})
	eventually(t, "both addresses' rules programmed", func() bool {
		return testutil.ToFloat64(a.m.connected.WithLabelValues("address/10.250.2.2")) == 1 &&
			testutil.ToFloat64(a.m.connected.WithLabelValues("address/10.250.2.3")) == 1
	})
	eventually(t, "a → b:8080 connects", func() bool { return netnstest.Connects(t, tp.A, "10.250.2.2:8080") })
	for _, target := range []string{"10.250.2.2:9090", "10.250.2.3:8080"} {
		eventually(t, "a → "+target+" is dropped", func() bool { return netnstest.Blocked(t, tp.A, target) })
	}
}

package server

import (
	"context"
	"fmt"
	"net"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// observedFlows reads a server's observed flows, as "src -> dst proto/port
// xCOUNT" lines, sorted.
func observedFlows(t *testing.T, conn grpc.ClientConnInterface) []string {
	t.Helper()
	st, err := verdictv1.NewAnalysisServiceClient(conn).ObservedFlows(ctxT(t), &verdictv1.ObservedFlowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, page := range recvAll(t, st.Recv) {
		for _, f := range page.GetFlows() {
			out = append(out, fmt.Sprintf("%s -> %s %s/%d x%d %s", observedText(f.GetSource()), observedText(f.GetDestination()),
				f.GetProtocol(), f.GetPort(), f.GetCount(), f.GetAction()))
		}
	}
	sort.Strings(out)
	return out
}

func observedText(e *verdictv1.ObservedEnd) string {
	g := e.GetGiven()
	switch {
	case g.GetWorkload() != "":
		return "workload:" + g.GetWorkload()
	case g.GetAddress() != "":
		return "address:" + g.GetAddress()
	case g.GetIdentity() != 0:
		return "identity:" + e.GetTags()["app"] // the tags it stands for
	}
	return fmt.Sprintf("tags:%v", g.GetTags())
}

// TestEveryDecisionPathIsObserved decides flows on each decision path and
// reads them back from the observed-flows table; the analyses that follow
// decide many flows and add none.
func TestEveryDecisionPathIsObserved(t *testing.T) {
	t.Parallel()
	identities := func(t *testing.T, h *harness) (uint64, uint64) {
		r, err := h.dec.Identify(ctxT(t), &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{tags("app", "backend"), tags("app", "db")}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetResults()[0].GetIdentity(), r.GetResults()[1].GetIdentity()
	}
	backendToDB := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "backend-1"}, Destination: &verdictv1.Endpoint{Address: "10.0.0.5"},
		Protocol: "TCP", Port: 5432}
	cases := []struct {
		name   string
		decide func(t *testing.T, h *harness)
		want   []string
	}{
		{"Decide", func(t *testing.T, h *harness) {
			if _, err := h.dec.Decide(ctxT(t), backendToDB); err != nil {
				t.Fatal(err)
			}
		}, []string{"workload:backend-1 -> address:10.0.0.5 TCP/5432 x1 ACTION_ALLOW"}},
		{"DecideBatch", func(t *testing.T, h *harness) {
			web := &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: &verdictv1.Endpoint{Workload: "db-1"}, Protocol: "TCP", Port: 5432}
			if _, err := h.dec.DecideBatch(ctxT(t), &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{web, web, backendToDB}}); err != nil {
				t.Fatal(err)
			}
		}, []string{"tags:map[app:web] -> workload:db-1 TCP/5432 x2 ACTION_DENY", "workload:backend-1 -> address:10.0.0.5 TCP/5432 x1 ACTION_ALLOW"}},
		{"DecideStream", func(t *testing.T, h *harness) {
			st, err := h.dec.DecideStream(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			for id := range uint64(3) {
				if err := st.Send(&verdictv1.DecideStreamRequest{Id: fmt.Sprint(id), Request: backendToDB}); err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(); err != nil {
					t.Fatal(err)
				}
			}
			_ = st.CloseSend()
		}, []string{"workload:backend-1 -> address:10.0.0.5 TCP/5432 x3 ACTION_ALLOW"}},
		{"DecideCompact", func(t *testing.T, h *harness) {
			src, dst := identities(t, h)
			pp := uint32(5432) | uint32(1)<<16 // TCP
			req := &verdictv1.DecideCompactRequest{SourceIds: []uint64{src, src}, DestinationIds: []uint64{dst, dst}, PortProtocols: []uint32{pp, pp}}
			for range 2 {
				if _, err := h.dec.DecideCompact(ctxT(t), req); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"identity:backend -> identity:db TCP/5432 x4 ACTION_ALLOW"}},
		{"DecideCompactStream", func(t *testing.T, h *harness) {
			src, dst := identities(t, h)
			st, err := h.dec.DecideCompactStream(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			req := &verdictv1.DecideCompactRequest{SourceIds: []uint64{dst}, DestinationIds: []uint64{src}, PortProtocols: []uint32{80 | 1<<16}}
			if err := st.Send(&verdictv1.DecideCompactStreamRequest{Id: 1, Batch: req}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			_ = st.CloseSend()
		}, []string{"identity:db -> identity:backend TCP/80 x1 ACTION_DENY"}},
		{"Check", func(t *testing.T, h *harness) {
			if _, err := authzClient(h).Check(ctxT(t), envoyTCPCheck(plainConn, envoyFilter{})); err != nil {
				t.Fatal(err)
			}
		}, []string{"address:10.0.0.1 -> address:10.0.0.2 TCP/8080 x1 ACTION_DENY"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
			c.decide(t, h)
			if got := observedFlows(t, h.conn); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("observed\n%s\nwant\n%s", got, c.want)
			}
			// Analyses decide without being observed.
			an := verdictv1.NewAnalysisServiceClient(h.conn)
			rs, err := an.Reach(ctxT(t), &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"},
				Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO, Protocol: "TCP", Port: 5432})
			if err != nil {
				t.Fatal(err)
			}
			recvAll(t, rs.Recv)
			ms, err := an.Matrix(ctxT(t), &verdictv1.MatrixRequest{})
			if err != nil {
				t.Fatal(err)
			}
			recvAll(t, ms.Recv)
			if _, err := an.Impact(ctxT(t), &verdictv1.ImpactRequest{Deletes: []string{"default/policies/TrafficPermission/backend-to-db"},
				Explain: true}); err != nil {
				t.Fatal(err)
			}
			if got := observedFlows(t, h.conn); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("after the analyses, observed\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// TestCompactCountsAreExact streams the same compact batches from two
// clients while the table is read: most of their flows are counted in the
// pair memo's entries and taken by the reads, and every decision is in the
// table once the streams end.
func TestCompactCountsAreExact(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	r, err := h.dec.Identify(ctxT(t), &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{tags("app", "backend"), tags("app", "db")}})
	if err != nil {
		t.Fatal(err)
	}
	backend, db := r.GetResults()[0].GetIdentity(), r.GetResults()[1].GetIdentity()
	req := &verdictv1.DecideCompactRequest{SourceIds: []uint64{backend, db, backend}, DestinationIds: []uint64{db, backend, db},
		PortProtocols: []uint32{5432 | 1<<16, 80 | 1<<16, 5432 | 1<<16}}
	const streams, batches = 2, 150
	done := make(chan struct{})
	errs := make(chan error, streams)
	for range streams {
		go func() {
			errs <- func() error {
				st, err := h.dec.DecideCompactStream(ctxT(t))
				if err != nil {
					return err
				}
				for id := range uint64(batches) {
					if err := st.Send(&verdictv1.DecideCompactStreamRequest{Id: id, Batch: req}); err != nil {
						return err
					}
					if _, err := st.Recv(); err != nil {
						return err
					}
				}
				return st.CloseSend()
			}()
		}()
	}
	go func() {
		for range streams {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		close(done)
	}()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
			observedFlows(t, h.conn)
		}
	}
	want := []string{fmt.Sprintf("identity:backend -> identity:db TCP/5432 x%d ACTION_ALLOW", 2*streams*batches),
		fmt.Sprintf("identity:db -> identity:backend TCP/80 x%d ACTION_DENY", streams*batches)}
	if got := observedFlows(t, h.conn); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("observed\n%s\nwant\n%s", got, want)
	}
}

// denyBackend denies backend to db before every other policy.
var denyBackend = policyRes(&verdictv1.Policy{Name: "deny-backend", Action: "DENY", Priority: -1,
	Sources: []*verdictv1.Selector{{Match: map[string]string{"app": "backend"}}}, Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "db"}}}})

// observedChanges are an Impact answer's observed changes as lines.
func observedChanges(resp *verdictv1.ImpactResponse) []string {
	var out []string
	for _, c := range resp.GetChanges() {
		if c.GetObserved() {
			out = append(out, fmt.Sprintf("%s -> %s %s/%d x%d %s->%s", apiEndpointText(c.GetSource()), apiEndpointText(c.GetDestination()),
				c.GetProtocol(), c.GetPort(), c.GetCount(), c.GetBefore().GetAction(), c.GetAfter().GetAction()))
		}
	}
	sort.Strings(out)
	return out
}

func apiEndpointText(e *verdictv1.Endpoint) string {
	switch {
	case e.GetWorkload() != "":
		return e.GetWorkload()
	case e.GetAddress() != "":
		return e.GetAddress()
	}
	return fmt.Sprint(e.GetTags())
}

func TestImpactReplaysTheObservedFlows(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		observed int // Config.ObservedFlows
		change   *verdictv1.ImpactRequest
		want     []string
	}{
		{"a deny on an observed allowed flow", 0, &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{denyBackend}},
			[]string{"backend-2 -> 10.0.0.5 TCP/5432 x2 ACTION_ALLOW->ACTION_DENY", "map[app:backend] -> db-1 TCP/5432 x1 ACTION_ALLOW->ACTION_DENY"}},
		{"an unrelated change", 0, &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{sdPolicy("cache-to-cache", "cache", "cache", "ALLOW")}}, nil},
		{"a change in another mesh", 0, &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Mesh: "other", Name: "deny-backend",
			Action: "DENY", Sources: []*verdictv1.Selector{{Match: map[string]string{"app": "backend"}}}, Destinations: []*verdictv1.Selector{{}}})}}, nil},
		{"no table", -1, &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{denyBackend}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, newBackend(decodeYAML(t, analysisWorld)...), func(cfg *Config) { cfg.ObservedFlows = c.observed })
			flows := []*verdictv1.DecideRequest{
				{Source: &verdictv1.Endpoint{Workload: "backend-2"}, Destination: &verdictv1.Endpoint{Address: "10.0.0.5"}, Protocol: "TCP", Port: 5432},
				{Source: &verdictv1.Endpoint{Workload: "backend-2"}, Destination: &verdictv1.Endpoint{Address: "10.0.0.5"}, Protocol: "TCP", Port: 5432},
				{Source: tags("app", "backend"), Destination: &verdictv1.Endpoint{Workload: "db-1"}, Protocol: "TCP", Port: 5432},
				{Source: tags("app", "web"), Destination: &verdictv1.Endpoint{Workload: "db-1"}, Protocol: "TCP", Port: 5432},
			}
			if _, err := h.dec.DecideBatch(ctxT(t), &verdictv1.DecideBatchRequest{Requests: flows}); err != nil {
				t.Fatal(err)
			}
			resp, err := verdictv1.NewAnalysisServiceClient(h.conn).Impact(ctxT(t), c.change)
			if err != nil {
				t.Fatal(err)
			}
			if got := observedChanges(resp); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("observed changes\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// staticFleet is a fleet of fixed replicas.
type staticFleet []Replica

func (f staticFleet) Replicas(context.Context) ([]Replica, error) { return f, nil }

// TestImpactAsksTheFleet runs two replicas of one store and a third that
// never answers: Impact with fleet on one replica replays what the other
// observed, merged with its own, and names the silent one.
func TestImpactAsksTheFleet(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, analysisWorld)...)
	a := start(t, b, nil)
	silent := bufconn.Listen(1 << 10) // accepts nothing: a replica that hangs
	t.Cleanup(func() { silent.Close() })
	fleet := staticFleet{{ID: "a", Address: "passthrough:///a"}, {ID: "b", Address: "passthrough:///b"}, {ID: "c", Address: "passthrough:///c"}}
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if addr == "a" {
			return a.lis.DialContext(ctx)
		}
		return silent.DialContext(ctx)
	})
	bh := start(t, b, func(c *Config) {
		c.Fleet, c.Replica, c.FleetTimeout = fleet, fleet[1], 2*time.Second
		c.PeerDialOptions = func(string) ([]grpc.DialOption, error) {
			return []grpc.DialOption{dialer, grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
		}
	})
	flow := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "backend-2"}, Destination: &verdictv1.Endpoint{Address: "10.0.0.5"},
		Protocol: "TCP", Port: 5432}
	for _, h := range []*harness{a, a, bh} {
		if _, err := h.dec.Decide(ctxT(t), flow); err != nil {
			t.Fatal(err)
		}
	}
	web := &verdictv1.DecideRequest{Source: tags("app", "backend", "zone", "a"), Destination: &verdictv1.Endpoint{Workload: "db-1"}, Protocol: "TCP", Port: 5432}
	if _, err := a.dec.Decide(ctxT(t), web); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		fleet    bool
		want     []string
		replicas []string
	}{
		{"the fleet", true, []string{"backend-2 -> 10.0.0.5 TCP/5432 x3 ACTION_ALLOW->ACTION_DENY",
			"map[app:backend zone:a] -> db-1 TCP/5432 x1 ACTION_ALLOW->ACTION_DENY"},
			[]string{"b self 1 ok", "a 2 ok", "c 0 error"}},
		{"this replica alone", false, []string{"backend-2 -> 10.0.0.5 TCP/5432 x1 ACTION_ALLOW->ACTION_DENY"}, []string{"b self 1 ok"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := verdictv1.NewAnalysisServiceClient(bh.conn).Impact(ctxT(t),
				&verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{denyBackend}, Fleet: c.fleet})
			if err != nil {
				t.Fatal(err)
			}
			if got := observedChanges(resp); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("observed changes\n%s\nwant\n%s", got, c.want)
			}
			var reps []string
			for _, r := range resp.GetReplicas() {
				s := r.GetId()
				if r.GetSelf() {
					s += " self"
				}
				s += fmt.Sprintf(" %d", r.GetFlows())
				if r.GetError() != "" {
					s += " error"
				} else {
					s += " ok"
				}
				reps = append(reps, s)
			}
			if fmt.Sprint(reps) != fmt.Sprint(c.replicas) {
				t.Errorf("replicas %v (%v), want %v", reps, resp.GetReplicas(), c.replicas)
			}
		})
	}
}

package server

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

const testPolicies = `
kind: Mesh
name: default
---
kind: Policy
name: web-to-backend
sources: [{match: {app: web}}]
destinations: [{match: {app: backend}}]
ports: [{protocol: TCP, ports: "8080"}]
---
kind: Policy
name: deny-db
sources: [{match: {app: '*'}}]
destinations: [{match: {app: db}}]
action: DENY
---
kind: Policy
name: log-all
type: TrafficLog
sources: [{match: {app: '*'}}]
destinations: [{match: {app: '*'}}]
conf: {backend: splunk, sample: 0.5}
---
kind: Scope
mesh: prod
name: Apps
selectors: [{match: {env: prod}}]
catchAll: DENY
---
kind: Policy
mesh: prod
name: web-in-apps
scope: Apps
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
`

func decodeYAML(t testing.TB, s string) []resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

type harness struct {
	b      *backend
	srv    *Server
	conn   *grpc.ClientConn
	dec    verdictv1.DecisionServiceClient
	pol    verdictv1.PolicyServiceClient
	wat    verdictv1.WatchServiceClient
	health healthpb.HealthClient
	stop   func()
	dial   func() *grpc.ClientConn // another connection to the server, closed at the end of the test
	lis    *bufconn.Listener
}

// start serves b over bufconn with the generated clients; the server stops
// at the end of the test.
func start(t testing.TB, b *backend, mod func(*Config), dialOpts ...grpc.DialOption) *harness {
	t.Helper()
	// WatchConditions as verdictd sets it by default.
	cfg := Config{ShutdownTimeout: 2 * time.Second, WaitTimeout: 300 * time.Millisecond, WatchConditions: true}
	if b != nil {
		cfg.Syncer, cfg.Store = b, b
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	opts := append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dialOpts...)
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	conn := dial()
	h := &harness{b: b, srv: srv, conn: conn,
		dec: verdictv1.NewDecisionServiceClient(conn), pol: verdictv1.NewPolicyServiceClient(conn),
		wat: verdictv1.NewWatchServiceClient(conn), health: healthpb.NewHealthClient(conn), dial: dial, lis: lis}
	stopped := false
	h.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		conn.Close()
	}
	t.Cleanup(h.stop)
	return h
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t testing.TB, err error, code codes.Code) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
	return st
}

// violations returns the BadRequest field violations of a status.
func violations(st *status.Status) map[string]string {
	out := map[string]string{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				out[fv.GetField()] = fv.GetDescription()
			}
		}
	}
	return out
}

func tags(kv ...string) *verdictv1.Endpoint {
	w := &verdictv1.Endpoint{Tags: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		w.Tags[kv[i]] = kv[i+1]
	}
	return w
}

func policyRes(p *verdictv1.Policy) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: p}}
}

func sdPolicy(name, src, dst, action string) *verdictv1.Resource {
	return policyRes(&verdictv1.Policy{Name: name,
		Sources:      []*verdictv1.Selector{{Match: map[string]string{"app": src}}},
		Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": dst}}},
		Action:       action})
}

// serveRaw serves a bare grpc.Server over bufconn (for baselines).
func serveRaw(t testing.TB, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return conn
}

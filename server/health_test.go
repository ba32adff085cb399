package server

import (
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestHealthServingOnceSynced(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies)...)
	b.setSynced(false)
	h := start(t, b, nil)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := h.health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	time.Sleep(60 * time.Millisecond)
	if s := check(""); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("before the first sync: %v", s)
	}
	b.setSynced(true)
	deadline := time.Now().Add(5 * time.Second)
	for check("verdict.v1.DecisionService") != healthpb.HealthCheckResponse_SERVING {
		if time.Now().After(deadline) {
			t.Fatal("not SERVING after the sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.mu.Lock()
	b.stale = true // etcd unreachable: the last snapshot keeps serving
	b.mu.Unlock()
	time.Sleep(60 * time.Millisecond)
	if s := check(""); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("while stale: %v", s)
	}
}

func TestHealthWaitsForReady(t *testing.T) {
	t.Parallel()
	ready := make(chan struct{})
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Ready = ready })
	time.Sleep(60 * time.Millisecond)
	r, err := h.health.Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("before ready: %v %v", r, err)
	}
	close(ready)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := h.health.Check(ctxT(t), &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not SERVING once ready: %v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

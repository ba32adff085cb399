package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/internal/testpki"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func TestAuthorizationToken(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Token = "s3cret" })
	with := func(v string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "authorization", v)
	}
	tests := []struct {
		name string
		ctx  context.Context
		code codes.Code
	}{
		{"no credentials", ctxT(t), codes.Unauthenticated},
		{"wrong token", with("Bearer nope"), codes.Unauthenticated},
		{"not bearer", with("Basic s3cret"), codes.Unauthenticated},
		{"token", with("Bearer s3cret"), codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.pol.Status(tc.ctx, &verdictv1.StatusRequest{})
			wantCode(t, err, tc.code)
			_, err = h.pol.Apply(tc.ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("x", "a", "b", "")}, DryRun: true})
			wantCode(t, err, tc.code)
			s, err := h.wat.WatchResources(tc.ctx, &verdictv1.WatchResourcesRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			wantCode(t, err, tc.code)
		})
	}
	// Decisions and WatchRules stay open.
	if _, err := h.dec.Decide(ctxT(t), &verdictv1.DecideRequest{}); err != nil {
		t.Errorf("Decide without credentials: %v", err)
	}
	s, err := h.wat.WatchRules(ctxT(t), &verdictv1.WatchRulesRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		t.Errorf("WatchRules without credentials: %v", err)
	}
}

func TestAuthorizationMutualTLS(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "verdict test CA")
	srvCert := ca.Server(t)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}, ClientCAs: ca.Pool(),
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	admin := ca.Client(t, nil, "spiffe://verdict.test/admin")
	ops := ca.Client(t, []string{"ops.verdict.test"})
	other := ca.Client(t, []string{"intruder.example"}, "spiffe://verdict.test/intruder")
	stranger := testpki.NewCA(t, "another CA").Client(t, nil, "spiffe://verdict.test/admin")
	b := newBackend(decodeYAML(t, testPolicies)...)
	tests := []struct {
		name string
		cert *testpki.Pair
		code codes.Code
	}{
		{"URI SAN on the list", admin, codes.OK},
		{"DNS SAN on the list", ops, codes.OK},
		{"not on the list", other, codes.PermissionDenied},
		{"no client certificate", nil, codes.Unauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clientTLS := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
			if tc.cert != nil {
				clientTLS.Certificates = []tls.Certificate{tc.cert.TLS}
			}
			h := start(t, b, func(c *Config) {
				c.TLS = serverTLS
				c.AllowedIdentities = []string{"spiffe://verdict.test/admin", "ops.verdict.test"}
			}, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
			_, err := h.pol.Status(ctxT(t), &verdictv1.StatusRequest{})
			wantCode(t, err, tc.code)
			if _, err := h.dec.Decide(ctxT(t), &verdictv1.DecideRequest{}); err != nil {
				t.Errorf("Decide over TLS: %v", err)
			}
		})
	}
	t.Run("certificate of another CA", func(t *testing.T) {
		clientTLS := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{stranger.TLS},
			MinVersion: tls.VersionTLS12}
		h := start(t, b, func(c *Config) {
			c.TLS = serverTLS
			c.AllowedIdentities = []string{"spiffe://verdict.test/admin"}
		}, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		if _, err := h.pol.Status(ctxT(t), &verdictv1.StatusRequest{}); err == nil {
			t.Error("a certificate of another CA was admitted")
		}
	})
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := newBackend()
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Syncer: b, Store: b}, true},
		{"no syncer", Config{Store: b}, false},
		{"allow-list without mTLS", Config{Syncer: b, Store: b, AllowedIdentities: []string{"x"}}, false},
		{"negative timeout", Config{Syncer: b, Store: b, WaitTimeout: -1}, false},
		{"WatchRules caps", Config{Syncer: b, Store: b, RulesMaxStreams: 100, RulesMaxStreamsPerCaller: 10, RulesMaxStreamsPerConn: 5}, true},
		{"a negative WatchRules cap", Config{Syncer: b, Store: b, RulesMaxStreamsPerConn: -1}, false},
		{"a caller's cap over the server's", Config{Syncer: b, Store: b, RulesMaxStreams: 100, RulesMaxStreamsPerCaller: 200}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestRefusedCallsLogRateLimited: a client retrying a wrong token in a loop
// gets one WARN per interval, not one per call (issue 12: log flooding).
func TestRefusedCallsLogRateLimited(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) {
		c.Token, c.Logger, c.AuthLogInterval = "s3cret", log, time.Hour
	})
	wrong := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer nope")
	for range 100 {
		_, err := h.pol.Status(wrong, &verdictv1.StatusRequest{})
		wantCode(t, err, codes.Unauthenticated)
	}
	warns := 0
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == "WARN" {
			warns++
			if rec["msg"] != "call refused" || rec["method"] != verdictv1.PolicyService_Status_FullMethodName {
				t.Errorf("warning %v", rec)
			}
		}
	}
	if warns != 1 {
		t.Errorf("%d warnings for 100 refused calls, want 1:\n%s", warns, logs.String())
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	r := &rateLimit{interval: 10 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		at         time.Duration
		through    bool
		suppressed int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2},
		{11 * time.Second, false, 0},
		{time.Minute, true, 1},
		{2 * time.Minute, true, 0},
	}
	for _, st := range steps {
		through, suppressed := r.note(t0.Add(st.at))
		if through != st.through || suppressed != st.suppressed {
			t.Errorf("at %v: %v, %d; want %v, %d", st.at, through, suppressed, st.through, st.suppressed)
		}
	}
}

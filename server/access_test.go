package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Access as docs/api.md says: with auth on, anyone may decide and identify,
// but explain needs an authorized caller, and an answer to anyone else says
// only how each end resolved (form, resolved_as, identity) — no workload
// name, no tags. Development mode admits everything.
func TestAccessByRow(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies+testWorkloads)...)
	withAuth := start(t, b, func(c *Config) { c.Token = "s3cret" })
	dev := start(t, b, nil)
	bearer := func(ctx context.Context, vals ...string) context.Context {
		for _, v := range vals {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
		}
		return ctx
	}
	byAddress := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "10.0.0.1"},
		Destination: &verdictv1.Endpoint{Workload: "backend-1"}, Protocol: "TCP", Port: 8080}
	explained := &verdictv1.DecideRequest{Source: byAddress.Source, Destination: byAddress.Destination,
		Protocol: "TCP", Port: 8080, Explain: true}
	tests := []struct {
		name string
		h    *harness
		ctx  context.Context
		code codes.Code // of every call
		// names: the answers carry workload names (and tags with explain)
		names bool
	}{
		{"anonymous", withAuth, ctxT(t), codes.OK, false},
		{"token", withAuth, bearer(ctxT(t), "Bearer s3cret"), codes.OK, true},
		{"wrong token", withAuth, bearer(ctxT(t), "Bearer nope"), codes.OK, false},
		{"development mode", dev, ctxT(t), codes.OK, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A plain Decide is answered; workload names only for authorized callers.
			resp, err := tc.h.dec.Decide(tc.ctx, byAddress)
			if err != nil {
				t.Fatal(err)
			}
			wantNames(t, "Decide", resp.GetSourceResolution(), "web-1", tc.names)
			wantNames(t, "Decide", resp.GetDestinationResolution(), "backend-1", tc.names)

			// Explain needs an authorized caller.
			resp, err = tc.h.dec.Decide(tc.ctx, explained)
			if !tc.names {
				st := wantCode(t, err, codes.Unauthenticated)
				if !strings.Contains(st.Message(), "explain needs an authorized caller") {
					t.Errorf("Decide with explain: message %q", st.Message())
				}
			} else if err != nil || resp.GetExplanation() == nil || resp.GetSourceResolution().GetTags()["app"] != "web" {
				t.Errorf("Decide with explain: %v, %v", resp, err)
			}

			// DecideBatch: the same per flow; one explained flow needs authorization for the call.
			batch, err := tc.h.dec.DecideBatch(tc.ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{byAddress}})
			if err != nil {
				t.Fatal(err)
			}
			wantNames(t, "DecideBatch", batch.GetResults()[0].GetResponse().GetSourceResolution(), "web-1", tc.names)
			_, err = tc.h.dec.DecideBatch(tc.ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{byAddress, explained}})
			if want := codes.Unauthenticated; tc.names {
				wantCode(t, err, codes.OK)
			} else {
				wantCode(t, err, want)
			}

			// DecideStream: an explained message gets an error answer, the
			// stream goes on; the plain one is answered as Decide is.
			s, err := tc.h.dec.DecideStream(tc.ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []*verdictv1.DecideStreamRequest{{Id: "explain", Request: explained}, {Id: "plain", Request: byAddress}} {
				if err := s.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				a, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				switch a.GetId() {
				case "explain":
					if got := a.GetResult().GetError().GetCode(); tc.names != (got == "") || !tc.names && got != codes.Unauthenticated.String() {
						t.Errorf("DecideStream with explain: %v", a)
					}
				case "plain":
					wantNames(t, "DecideStream", a.GetResult().GetResponse().GetSourceResolution(), "web-1", tc.names)
				}
			}

			// Identify: an address's identity for anyone, its workload only for authorized callers.
			id, err := tc.h.dec.Identify(tc.ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{{Address: "10.0.0.3"}}})
			if err != nil {
				t.Fatal(err)
			}
			wantNames(t, "Identify", id.GetResults()[0].GetResolution(), "db-1", tc.names)

			// WatchRules of an address: the rules for anyone; the workload
			// they are for named only to authorized callers.
			rules, err := tc.h.wat.WatchRules(tc.ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{Address: "10.0.0.2"}})
			if err != nil {
				t.Fatal(err)
			}
			first, err := rules.Recv()
			if err != nil {
				t.Fatal(err)
			}
			wantNames(t, "WatchRules", first.GetWorkload(), "backend-1", tc.names)
			if first.GetInbound() == nil {
				t.Errorf("WatchRules: no inbound rules: %v", first)
			}

			// Envoy's Check: the metadata names the workloads only for authorized callers.
			check, err := authzClient(tc.h).Check(tc.ctx, envoyTCPCheck(plainConn, envoyFilter{}))
			if err != nil {
				t.Fatal(err)
			}
			src := check.GetDynamicMetadata().GetFields()["source"].GetStructValue().GetFields()
			if got := src["workload"].GetStringValue(); (got == "web-1") != tc.names || src["identity"].GetStringValue() == "" {
				t.Errorf("Check's metadata source %v: want the workload name %v, the identity always", src, tc.names)
			}
		})
	}
	// Methods only authorized callers may call.
	for _, ctx := range []context.Context{ctxT(t), bearer(ctxT(t), "Bearer nope")} {
		_, err := withAuth.pol.Status(ctx, &verdictv1.StatusRequest{})
		wantCode(t, err, codes.Unauthenticated)
	}
}

// wantNames checks a resolution reported to a caller: form, resolved_as and
// identity always; the workload name (and holders, tags) only when names.
func wantNames(t *testing.T, rpc string, r *verdictv1.EndpointResolution, workload string, names bool) {
	t.Helper()
	if r.GetForm() == verdictv1.EndpointForm_ENDPOINT_FORM_UNSPECIFIED || r.GetResolvedAs() != verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD ||
		r.GetIdentity() == 0 {
		t.Errorf("%s: resolution %v lacks form, resolved_as or identity", rpc, r)
	}
	if got := r.GetWorkload(); (got == workload) != names || !names && (got != "" || r.GetTags() != nil || r.GetHolders() != 0) {
		t.Errorf("%s: resolution %v: want workload names %v", rpc, r, names)
	}
}

// Two authorization headers are refused on every method, never "the first
// decides".
func TestAmbiguousAuthorizationRefused(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Token = "s3cret" })
	for _, vals := range [][]string{{"Bearer s3cret", "Bearer nope"}, {"Bearer s3cret", "Bearer s3cret"}, {"Bearer nope", "Bearer s3cret"}} {
		ctx := ctxT(t)
		for _, v := range vals {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
		}
		_, err := h.pol.Status(ctx, &verdictv1.StatusRequest{})
		st := wantCode(t, err, codes.Unauthenticated)
		if !strings.Contains(st.Message(), "more than one authorization header") {
			t.Errorf("%v: message %q", vals, st.Message())
		}
		_, err = h.dec.Decide(ctx, &verdictv1.DecideRequest{})
		wantCode(t, err, codes.Unauthenticated)
		s, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, err, codes.Unauthenticated)
	}
}

// A stream message waits for its min_revision at most WaitTimeout, whatever
// the stream's deadline: DecideCompactStream as DecideStream.
func TestStreamMessageWaitIsBounded(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WaitTimeout = 100 * time.Millisecond })
	// The stream's own deadline is far away; the answer must come long before.
	streamCtx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	const answerWithin = 30 * time.Second // generous: the wait is 100 ms
	tests := []struct {
		name string
		ask  func() (code string, err error)
	}{
		{"DecideCompactStream", func() (string, error) {
			s, err := h.dec.DecideCompactStream(streamCtx)
			if err != nil {
				return "", err
			}
			if err := s.Send(&verdictv1.DecideCompactStreamRequest{Id: 1, Batch: &verdictv1.DecideCompactRequest{MinRevision: 1 << 40}}); err != nil {
				return "", err
			}
			r, err := s.Recv()
			return r.GetError().GetCode(), err
		}},
		{"DecideStream", func() (string, error) {
			s, err := h.dec.DecideStream(streamCtx)
			if err != nil {
				return "", err
			}
			if err := s.Send(&verdictv1.DecideStreamRequest{Id: "a", Request: &verdictv1.DecideRequest{MinRevision: 1 << 40}}); err != nil {
				return "", err
			}
			r, err := s.Recv()
			return r.GetResult().GetError().GetCode(), err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			type answer struct {
				code string
				err  error
			}
			got := make(chan answer, 1)
			go func() {
				code, err := tc.ask()
				got <- answer{code, err}
			}()
			select {
			case a := <-got:
				if a.err != nil || a.code != codes.Unavailable.String() {
					t.Errorf("answer %q, %v; want an UNAVAILABLE answer", a.code, a.err)
				}
			case <-time.After(answerWithin):
				t.Fatalf("no answer within %v: the message waits out the stream's deadline", answerWithin)
			}
		})
	}
}

// A request over its method's limit, yet within gRPC's, is refused by its
// row: RESOURCE_EXHAUSTED for an ordinary call, an error answer for one
// stream message (the stream goes on), and a DENY — never a gRPC error,
// which Envoy's failure_mode_allow would let pass — for Envoy's Check.
func TestOversizedRequests(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies+testWorkloads)...), nil)
	ctx := ctxT(t)
	big := func(n int) string { return strings.Repeat("x", n) }
	t.Run("Check with 5.3 MiB of headers", func(t *testing.T) {
		req := envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil, "x-big", big(5<<20+300<<10)))
		resp, err := authzClient(h).Check(ctx, req)
		if err != nil {
			t.Fatalf("a gRPC error (Envoy's failure_mode_allow would let it pass): %v", err)
		}
		wantDenied(t, resp, true, "over the limit of 4194304")
	})
	t.Run("Check with a 4 MiB body", func(t *testing.T) {
		req := envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil))
		req.Attributes.Request.Http.Body = big(4 << 20)
		resp, err := authzClient(h).Check(ctx, req)
		if err != nil {
			t.Fatalf("a gRPC error (Envoy's failure_mode_allow would let it pass): %v", err)
		}
		wantDenied(t, resp, true, "over the limit of 4194304")
	})
	t.Run("Check within its limit is decided", func(t *testing.T) {
		resp, err := authzClient(h).Check(ctx, envoyHTTPCheck(plainConn, envoyFilter{}, httpGet(nil, "x-big", big(1<<20))))
		if err != nil || strings.Contains(resp.GetStatus().GetMessage(), "over the limit") {
			t.Fatalf("%v, %v", resp, err)
		}
	})
	t.Run("Apply", func(t *testing.T) {
		_, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Deletes: []string{big(5 << 20)}})
		st := wantCode(t, err, codes.ResourceExhausted)
		if !strings.Contains(st.Message(), "over the limit of 4194304") {
			t.Errorf("message %q", st.Message())
		}
	})
	t.Run("DecideStream message", func(t *testing.T) {
		s, err := h.dec.DecideStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []*verdictv1.DecideStreamRequest{{Id: "big", Request: &verdictv1.DecideRequest{Mesh: big(5 << 20)}},
			{Id: "next", Request: &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend")}}} {
			if err := s.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		first, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := first.GetResult().GetError(); first.GetId() != "big" || e.GetCode() != codes.ResourceExhausted.String() ||
			!strings.Contains(e.GetMessage(), "over the limit") {
			t.Errorf("oversized message's answer %v", first)
		}
		next, err := s.Recv()
		if err != nil || next.GetResult().GetResponse() == nil {
			t.Errorf("the stream did not go on: %v, %v", next, err)
		}
	})
}

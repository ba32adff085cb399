package server

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	tests := []struct {
		name   string
		req    *verdictv1.DecideRequest
		action verdictv1.Action
		policy string
		reason verdictv1.Reason
	}{
		{"matching allow", &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"),
			Protocol: "TCP", Port: 8080}, verdictv1.Action_ACTION_ALLOW, "web-to-backend", verdictv1.Reason_REASON_MATCHED},
		{"port outside", &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"),
			Protocol: "tcp", Port: 9090}, verdictv1.Action_ACTION_DENY, "", verdictv1.Reason_REASON_DEFAULT_ACTION},
		{"deny", &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db")},
			verdictv1.Action_ACTION_DENY, "deny-db", verdictv1.Reason_REASON_MATCHED},
		{"scoped catch-all", &verdictv1.DecideRequest{Mesh: "prod", Source: tags("app", "web", "env", "prod"),
			Destination: tags("app", "db", "env", "prod")}, verdictv1.Action_ACTION_DENY, "", verdictv1.Reason_REASON_CATCH_ALL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, err := h.dec.Decide(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAction() != tc.action || resp.GetPolicy() != tc.policy || resp.GetInbound().GetReason() != tc.reason {
				t.Errorf("got %v %q %v, want %v %q %v", resp.GetAction(), resp.GetPolicy(), resp.GetInbound().GetReason(),
					tc.action, tc.policy, tc.reason)
			}
			if resp.GetRevision() != 1 {
				t.Errorf("revision %d, want 1", resp.GetRevision())
			}
		})
	}
}

func TestDecideConfAndExplain(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	resp, err := h.dec.Decide(ctxT(t), &verdictv1.DecideRequest{Type: "TrafficLog", Source: tags("app", "web"),
		Destination: tags("app", "db"), Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetConf().GetFields()["backend"].GetStringValue(); got != "splunk" {
		t.Errorf("conf.backend = %q", got)
	}
	if got := resp.GetConf().GetFields()["sample"].GetNumberValue(); got != 0.5 {
		t.Errorf("conf.sample = %v", got)
	}
	ex := resp.GetExplanation()
	if len(ex.GetInbound().GetCandidates()) != 1 || !ex.GetInbound().GetCandidates()[0].GetDecided() {
		t.Errorf("explanation %v: want one deciding candidate", ex)
	}
	plain, err := h.dec.Decide(ctxT(t), &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db")})
	if err != nil {
		t.Fatal(err)
	}
	if plain.GetExplanation() != nil {
		t.Error("an explanation nobody asked for")
	}
}

func TestDecideErrors(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	many := map[string]string{}
	for i := range 65 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name  string
		req   *verdictv1.DecideRequest
		code  codes.Code
		field string
	}{
		{"unknown mesh", &verdictv1.DecideRequest{Mesh: "nope"}, codes.NotFound, ""},
		{"bad protocol", &verdictv1.DecideRequest{Protocol: "SCTP"}, codes.InvalidArgument, "protocol"},
		{"bad port", &verdictv1.DecideRequest{Port: 70000}, codes.InvalidArgument, "port"},
		{"bad mesh name", &verdictv1.DecideRequest{Mesh: "a/b"}, codes.InvalidArgument, "mesh"},
		{"too many tags", &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: many}}, codes.InvalidArgument, "source.tags"},
		{"tag value too long", &verdictv1.DecideRequest{Destination: tags("k", strings.Repeat("v", 1025))}, codes.InvalidArgument, "destination.tags"},
		{"negative min_revision", &verdictv1.DecideRequest{MinRevision: -1}, codes.InvalidArgument, "minRevision"},
		{"min_revision never reached", &verdictv1.DecideRequest{MinRevision: 99}, codes.Unavailable, ""},
		{"min_revision never reached, no deadline", &verdictv1.DecideRequest{MinRevision: 99, Mesh: "noDeadline"}, codes.Unavailable, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			if tc.req.GetMesh() == "noDeadline" {
				ctx = context.Background() // the server waits WaitTimeout
			} else if tc.req.GetMinRevision() > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 2*time.Second) // the server stops waiting 400ms before
				defer cancel()
			}
			_, err := h.dec.Decide(ctx, tc.req)
			st := wantCode(t, err, tc.code)
			if tc.field != "" {
				if _, ok := violations(st)[tc.field]; !ok {
					t.Errorf("violations %v, want field %q", violations(st), tc.field)
				}
			}
		})
	}
}

func TestDecideBatch(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	resp, err := h.dec.DecideBatch(ctxT(t), &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{
		{Source: tags("app", "web"), Destination: tags("app", "db")},
		{Protocol: "bogus"},
		{Mesh: "nope"},
		{Source: tags("app", "web"), Destination: tags("app", "backend"), Protocol: "TCP", Port: 8080},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResults()
	if len(r) != 4 {
		t.Fatalf("%d results, want 4", len(r))
	}
	if r[0].GetResponse().GetPolicy() != "deny-db" || r[3].GetResponse().GetPolicy() != "web-to-backend" {
		t.Errorf("answers out of order: %v", r)
	}
	if e := r[1].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) != 1 ||
		e.GetFieldViolations()[0].GetField() != "requests[1].protocol" {
		t.Errorf("error entry %v", e)
	}
	if r[2].GetError().GetCode() != "NotFound" {
		t.Errorf("error entry %v", r[2].GetError())
	}
	big := make([]*verdictv1.DecideRequest, MaxBatch+1)
	for i := range big {
		big[i] = &verdictv1.DecideRequest{}
	}
	_, err = h.dec.DecideBatch(ctxT(t), &verdictv1.DecideBatchRequest{Requests: big})
	if _, ok := violations(wantCode(t, err, codes.InvalidArgument))["requests"]; !ok {
		t.Error("no violation on requests")
	}
}

func TestDecideStream(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	stream, err := h.dec.DecideStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*verdictv1.DecideStreamRequest{
		{Id: "a", Request: &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "db")}},
		{Id: "b", Request: &verdictv1.DecideRequest{Port: 1 << 20}},
		{Id: "c"},
		{Id: "d", Request: &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"), Protocol: "TCP", Port: 8080}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var got []*verdictv1.DecideStreamResponse
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 4 {
		t.Fatalf("%d answers, want 4", len(got))
	}
	for i, r := range got {
		if r.GetId() != msgs[i].GetId() {
			t.Errorf("answer %d has id %q, want %q", i, r.GetId(), msgs[i].GetId())
		}
	}
	if got[0].GetResult().GetResponse().GetAction() != verdictv1.Action_ACTION_DENY ||
		got[3].GetResult().GetResponse().GetAction() != verdictv1.Action_ACTION_ALLOW {
		t.Errorf("answers %v", got)
	}
	if e := got[1].GetResult().GetError(); e.GetCode() != "InvalidArgument" || e.GetFieldViolations()[0].GetField() != "request.port" {
		t.Errorf("error entry %v", e)
	}
	if e := got[2].GetResult().GetError(); e.GetCode() != "InvalidArgument" || e.GetFieldViolations()[0].GetField() != "request" {
		t.Errorf("error entry %v", e)
	}
}

func TestDecideStreamEndsOnShutdown(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	stream, err := h.dec.DecideStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: &verdictv1.DecideRequest{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { h.stop(); close(done) }()
	_, err = stream.Recv()
	wantCode(t, err, codes.Unavailable)
	<-done
}

func TestResolve(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	resp, err := h.dec.Resolve(ctxT(t), &verdictv1.ResolveRequest{Type: "TrafficLog", Source: tags("app", "web"),
		Destination: tags("app", "db")})
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]*verdictv1.ResolvedRule{}
	for _, r := range resp.GetRules() {
		rules[r.GetName()] = r
	}
	if rules["backend"].GetValue().GetStringValue() != "splunk" || rules["backend"].GetPolicy() != "log-all" {
		t.Errorf("rules %v", resp.GetRules())
	}
	if len(resp.GetStatus()) != 1 || resp.GetStatus()[0].GetState() != verdictv1.PolicyState_POLICY_STATE_ENFORCED {
		t.Errorf("status %v", resp.GetStatus())
	}
	_, err = h.dec.Resolve(ctxT(t), &verdictv1.ResolveRequest{Mesh: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = h.dec.Resolve(ctxT(t), &verdictv1.ResolveRequest{Type: "TrafficLog", Source: tags("app", "web")})
	wantCode(t, err, codes.InvalidArgument)
}

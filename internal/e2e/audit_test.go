package e2e

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// otlpCollector is an OTLP logs receiver: the collector's LogsService, served
// on loopback, keeping the log records it receives.
type otlpCollector struct {
	collogspb.UnimplementedLogsServiceServer
	mu      sync.Mutex
	records [][]*commonpb.KeyValue // each record's attributes
}

func (c *otlpCollector) Export(_ context.Context, r *collogspb.ExportLogsServiceRequest) (*collogspb.ExportLogsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rl := range r.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			for _, lr := range sl.GetLogRecords() {
				c.records = append(c.records, lr.GetAttributes())
			}
		}
	}
	return &collogspb.ExportLogsServiceResponse{}, nil
}

// audits returns, for every record received, its verdict.audit attribute as
// "ACTION policy side" ("" for a record without one).
func (c *otlpCollector) audits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, attrs := range c.records {
		s := ""
		for _, kv := range attrs {
			if kv.GetKey() != "verdict.audit" {
				continue
			}
			f := map[string]string{}
			for _, e := range kv.GetValue().GetKvlistValue().GetValues() {
				f[e.GetKey()] = e.GetValue().GetStringValue()
			}
			s = f["action"] + " " + f["policy"] + " " + f["side"]
		}
		out = append(out, s)
	}
	return out
}

// TestAuditPolicyEndToEnd: a DENY policy applied over gRPC with mode Audit
// changes no enforced answer and shows as the shadow result on the flows it
// would deny (Decide, DecideBatch, DecideStream, explain); the decision log,
// filtered to audit differences, records exactly those flows in its file sink
// and in its OTLP sink, received by an OTLP logs collector in the test.
// Not parallel: the OTLP exporter reads its endpoint from the environment.
func TestAuditPolicyEndToEnd(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &otlpCollector{}
	srv := grpc.NewServer()
	collogspb.RegisterLogsServiceServer(srv, col)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")

	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml", "--decision-log", "file:"+path+",otlp",
		"--decision-log-filter", "audit")
	conn := d.conn(t)
	waitServing(t, conn)
	dec := verdictv1.NewDecisionServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	flow := func(src, dst string, port uint32) *verdictv1.DecideRequest {
		return &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: map[string]string{"kuma.io/service": src}},
			Destination: &verdictv1.Endpoint{Tags: map[string]string{"kuma.io/service": dst}}, Protocol: "TCP", Port: port}
	}
	webBackend, backendDB := flow("web", "backend", 8080), flow("backend", "db", 5432)
	before := map[string]*verdictv1.DecideResponse{}
	for name, r := range map[string]*verdictv1.DecideRequest{"web-backend": webBackend, "backend-db": backendDB} {
		resp, err := dec.Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAudit() != nil {
			t.Fatalf("%s: an audit result before any audit policy: %v", name, resp.GetAudit())
		}
		before[name] = resp
	}

	var trial verdictv1.Resource
	if err := protojson.Unmarshal([]byte(`{"policy": {"mesh": "default", "name": "trial-deny-web", "mode": "Audit",
		"rank": "Absolute", "sources": [{"match": {"kuma.io/service": "web"}}], "destinations": [{}], "action": "DENY"}}`), &trial); err != nil {
		t.Fatal(err)
	}
	applied, err := verdictv1.NewPolicyServiceClient(conn).Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{&trial}})
	if err != nil {
		t.Fatal(err)
	}
	webBackend.MinRevision, backendDB.MinRevision = applied.GetRevision(), applied.GetRevision()

	check := func(how string, name string, resp *verdictv1.DecideResponse, wantAudit bool) {
		t.Helper()
		b := before[name]
		if resp.GetAction() != b.GetAction() || resp.GetPolicy() != b.GetPolicy() ||
			resp.GetInbound().GetPolicy() != b.GetInbound().GetPolicy() || resp.GetOutbound().GetPolicy() != b.GetOutbound().GetPolicy() {
			t.Errorf("%s %s: the enforced answer changed: %v, was %v", how, name, resp, b)
		}
		a := resp.GetAudit()
		switch {
		case !wantAudit && a != nil:
			t.Errorf("%s %s: audit %v, want none", how, name, a)
		case wantAudit && (a.GetAction() != verdictv1.Action_ACTION_DENY || a.GetPolicy() != "trial-deny-web" ||
			a.GetSide() != "inbound" || a.GetRule() != "sources[0]/destinations[0]"):
			t.Errorf("%s %s: audit %v, want DENY by trial-deny-web (inbound)", how, name, a)
		}
	}
	resp, err := dec.Decide(ctx, webBackend)
	if err != nil {
		t.Fatal(err)
	}
	check("Decide", "web-backend", resp, true)
	if resp, err = dec.Decide(ctx, backendDB); err != nil {
		t.Fatal(err)
	}
	check("Decide", "backend-db", resp, false)
	batch, err := dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{webBackend, backendDB},
		MinRevision: applied.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	check("DecideBatch", "web-backend", batch.GetResults()[0].GetResponse(), true)
	check("DecideBatch", "backend-db", batch.GetResults()[1].GetResponse(), false)
	stream, err := dec.DecideStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&verdictv1.DecideStreamRequest{Id: "1", Request: webBackend}); err != nil {
		t.Fatal(err)
	}
	sm, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	check("DecideStream", "web-backend", sm.GetResult().GetResponse(), true)
	_ = stream.CloseSend()

	explained := flow("web", "backend", 8080)
	explained.Explain, explained.MinRevision = true, applied.GetRevision()
	if resp, err = dec.Decide(ctx, explained); err != nil {
		t.Fatal(err)
	}
	marked := false
	for _, c := range resp.GetExplanation().GetInbound().GetCandidates() {
		if c.GetPolicy() == "trial-deny-web" {
			marked = c.GetAudit() && !c.GetDecided()
		}
	}
	if !marked {
		t.Errorf("explain does not list the audit rule, marked: %v", resp.GetExplanation().GetInbound())
	}

	// The log's filter is "audit": the three web → backend answers after the
	// apply, and the explained one — nothing else (the enforced answers of
	// backend → db and of the flows before the apply agree with their shadow).
	const want = 4
	var lines []string
	for ctx.Err() == nil {
		b, _ := os.ReadFile(path)
		if lines = strings.Split(strings.TrimSpace(string(b)), "\n"); len(b) > 0 && len(lines) >= want && len(col.audits()) >= want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(lines) != want {
		t.Fatalf("%d file records, want %d: %q", len(lines), want, lines)
	}
	for _, l := range lines {
		var r struct {
			Action string
			Audit  *struct{ Action, Policy, Side string }
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if r.Action != "ALLOW" || r.Audit == nil || r.Audit.Action != "DENY" || r.Audit.Policy != "trial-deny-web" || r.Audit.Side != "inbound" {
			t.Errorf("file record %s", l)
		}
	}
	got := col.audits()
	if len(got) != want {
		t.Fatalf("the OTLP collector received %d records, want %d: %q", len(got), want, got)
	}
	for _, a := range got {
		if a != "DENY trial-deny-web inbound" {
			t.Errorf("OTLP record's verdict.audit %q", a)
		}
	}
}

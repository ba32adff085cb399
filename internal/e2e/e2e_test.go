package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/internal/testpki"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/embedetcd"
)

const decideWebToBackend = `{"source":{"tags":{"kuma.io/service":"web"}},"destination":{"tags":{"kuma.io/service":"backend"}},"protocol":"TCP","port":8080}`

func tags(kv ...string) *verdictv1.Endpoint {
	w := &verdictv1.Endpoint{Tags: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		w.Tags[kv[i]] = kv[i+1]
	}
	return w
}

func sdPolicy(mesh, name, src, dst string) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: &verdictv1.Policy{Mesh: mesh, Name: name,
		Sources:      []*verdictv1.Selector{{Match: map[string]string{"kuma.io/service": src}}},
		Destinations: []*verdictv1.Selector{{Match: map[string]string{"kuma.io/service": dst}}}}}}
}

func TestGrpcurl(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	waitServing(t, d.conn(t))
	list := runTool(t, nil, nil, "grpcurl", "-plaintext", d.addr, "list")
	for _, svc := range []string{"verdict.v1.DecisionService", "verdict.v1.PolicyService", "verdict.v1.WatchService",
		"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(list.out, svc) {
			t.Errorf("grpcurl list: no %s in\n%s", svc, list.out)
		}
	}
	desc := runTool(t, nil, nil, "grpcurl", "-plaintext", d.addr, "describe", "verdict.v1.DecisionService")
	if desc.code != 0 || !strings.Contains(desc.out, "rpc Decide ( .verdict.v1.DecideRequest ) returns ( .verdict.v1.DecideResponse )") {
		t.Errorf("grpcurl describe: %d\n%s", desc.code, desc.out)
	}
	dec := runTool(t, nil, nil, "grpcurl", "-plaintext", "-d", decideWebToBackend, d.addr, "verdict.v1.DecisionService/Decide")
	if dec.code != 0 || !strings.Contains(dec.out, `"action": "ACTION_ALLOW"`) || !strings.Contains(dec.out, `"policy": "web-to-backend"`) {
		t.Errorf("grpcurl Decide: %d\n%s", dec.code, dec.out)
	}
	bad := runTool(t, nil, nil, "grpcurl", "-plaintext", "-d",
		`{"resources":[{"policy":{"name":"x","sources":[{}],"destinations":[{}],"action":"MAYBE"}}]}`, d.addr, "verdict.v1.PolicyService/Apply")
	if bad.code == 0 || !strings.Contains(bad.out, "InvalidArgument") || !strings.Contains(bad.out, `"field": "resources[0].policy.action"`) {
		t.Errorf("grpcurl Apply of an invalid policy: %d\n%s", bad.code, bad.out)
	}
}

// TestGeneratedClient calls every RPC of docs/api.md through the generated
// Go client against a real daemon.
func TestGeneratedClient(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	conn := d.conn(t)
	waitServing(t, conn)
	ctx := ctxT(t)
	dec := verdictv1.NewDecisionServiceClient(conn)
	pol := verdictv1.NewPolicyServiceClient(conn)
	wat := verdictv1.NewWatchServiceClient(conn)

	st, err := pol.Status(ctx, &verdictv1.StatusRequest{})
	if err != nil || !st.GetSynced() || st.GetResources() != 16 || len(st.GetDigest()) != 64 {
		t.Fatalf("Status: %v %v", st, err)
	}
	rules, err := wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("kuma.io/service", "db")})
	if err != nil {
		t.Fatal(err)
	}
	first, err := rules.Recv()
	if err != nil || len(first.GetInbound().GetRules()) != 2 {
		t.Fatalf("WatchRules: %v %v", first, err)
	}
	res, err := wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{Prefix: "default/"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := res.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetType() == verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
			break
		}
	}

	// Apply, then Decide with min_revision sees the write.
	ap, err := pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("default", "batch-to-db", "batch", "db")}})
	if err != nil {
		t.Fatal(err)
	}
	d1, err := dec.Decide(ctx, &verdictv1.DecideRequest{Source: tags("kuma.io/service", "batch"), Destination: tags("kuma.io/service", "db"),
		MinRevision: ap.GetRevision()})
	if err != nil || d1.GetAction() != verdictv1.Action_ACTION_ALLOW || d1.GetPolicy() != "batch-to-db" || d1.GetRevision() < ap.GetRevision() {
		t.Fatalf("Decide after Apply: %v %v", d1, err)
	}
	// WatchRules receives the change; WatchResources too.
	changed, err := rules.Recv()
	if err != nil || changed.GetRevision() != ap.GetRevision() || len(changed.GetInbound().GetRules()) != 3 {
		t.Fatalf("WatchRules after Apply: %v %v", changed, err)
	}
	ch, err := res.Recv()
	if err != nil || ch.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES ||
		ch.GetChanges()[0].GetKey() != "default/policies/TrafficPermission/batch-to-db" {
		t.Fatalf("WatchResources after Apply: %v %v", ch, err)
	}

	batch, err := dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{
		{Source: tags("kuma.io/service", "web"), Destination: tags("kuma.io/service", "db")}, {Protocol: "SCTP"}}})
	if err != nil || batch.GetResults()[0].GetResponse().GetPolicy() != "deny-all-to-db" || batch.GetResults()[1].GetError().GetCode() != "InvalidArgument" {
		t.Fatalf("DecideBatch: %v %v", batch, err)
	}
	stream, err := dec.DecideStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := stream.Send(&verdictv1.DecideStreamRequest{Id: id, Request: &verdictv1.DecideRequest{Mesh: "payments",
			Source: tags("tier", "app", "app", "gateway", "team", "payments"), Destination: tags("tier", "app", "app", "mainframe-bridge")}}); err != nil {
			t.Fatal(err)
		}
		a, err := stream.Recv()
		if err != nil || a.GetId() != id || a.GetResult().GetResponse().GetPolicy() != "block-mainframe" {
			t.Fatalf("DecideStream: %v %v", a, err)
		}
	}
	_ = stream.CloseSend()
	rv, err := dec.Resolve(ctx, &verdictv1.ResolveRequest{Type: "TrafficLog", Source: tags("kuma.io/service", "backend"),
		Destination: tags("kuma.io/service", "db", "env", "prod")})
	if err != nil || len(rv.GetRules()) != 3 {
		t.Fatalf("Resolve: %v %v", rv, err)
	}
	g, err := pol.Get(ctx, &verdictv1.GetRequest{Key: "default/policies/TrafficPermission/batch-to-db"})
	if err != nil || g.GetResource().GetModRevision() != ap.GetRevision() || g.GetResource().GetResource().GetPolicy().GetCreationTime() == nil {
		t.Fatalf("Get: %v %v", g, err)
	}
	l, err := pol.List(ctx, &verdictv1.ListRequest{Prefix: "payments/", PageSize: 3})
	if err != nil || len(l.GetResources()) != 3 || l.GetNextPageToken() == "" {
		t.Fatalf("List: %v %v", l, err)
	}
	_, err = pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("default", "batch-to-db", "batch", "db")},
		ExpectedRevisions: map[string]int64{"default/policies/TrafficPermission/batch-to-db": ap.GetRevision() - 1}})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("Apply with a stale expected revision: %v", err)
	}
	del, err := pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficPermission/batch-to-db"}})
	if err != nil {
		t.Fatal(err)
	}
	d2, err := dec.Decide(ctx, &verdictv1.DecideRequest{Source: tags("kuma.io/service", "batch"), Destination: tags("kuma.io/service", "db"),
		MinRevision: del.GetRevision()})
	if err != nil || d2.GetAction() != verdictv1.Action_ACTION_DENY {
		t.Fatalf("Decide after Delete: %v %v", d2, err)
	}

	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`verdict_decisions_total{action="ALLOW"}`, "verdict_decide_duration_seconds_bucket", "verdict_snapshot_revision",
		"verdict_watch_lag_seconds", "verdict_resources_invalid", "verdict_synced 1", "rpc_server_"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics has no %s", m)
		}
	}
}

func TestVerdictctl(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	waitServing(t, d.conn(t))
	env := []string{"VERDICT_SERVER=" + d.addr}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"decide", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend"}, 3, "NotFound"},
		{[]string{"apply", "-f", "examples/policies.yaml", "--dry-run"}, 0, "default/policies/TrafficPermission/web-to-backend created (dry run)"},
		{[]string{"apply", "-f", "examples/policies.yaml"}, 0, "default/policies/TrafficPermission/web-to-backend created"},
		{[]string{"apply", "-f", "examples/policies.yaml"}, 0, "nothing changed: nothing was written"},
		{[]string{"apply", "-f", "examples/kuma-traffic-permission.yaml"}, 0, "default/policies/TrafficPermission/legacy-to-db created"},
		{[]string{"decide", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend", "--proto", "TCP", "--port", "8080", "--min-revision", "3"}, 0, "ALLOW by policy web-to-backend"},
		{[]string{"decide", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=db", "--proto", "TCP", "--port", "5432"}, 1, "DENY by policy deny-all-to-db"},
		{[]string{"explain", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=db"}, 1, "MATCHED, DECIDED"},
		{[]string{"resolve", "--type", "TrafficLog", "--src", "kuma.io/service=backend", "--dst", "kuma.io/service=db,env=prod"}, 0, "log-db-access"},
		{[]string{"get", "policy", "legacy-to-db"}, 0, "kuma.io/protocol: tcp"},
		{[]string{"get", "default/policies/TrafficPermission/nope"}, 3, "NotFound"},
		{[]string{"list", "--mesh", "payments"}, 0, "payments/scopes/Apps:Payments"},
		{[]string{"status"}, 0, "synced:         true"},
		{[]string{"delete", "policy", "legacy-to-db"}, 0, "default/policies/TrafficPermission/legacy-to-db deleted"},
		{[]string{"delete", "scope", "Apps", "--mesh", "payments"}, 3, "would make it invalid"},
		{[]string{"decide", "--src", "a=b", "--dst", "c=d", "--proto", "SCTP"}, 2, "--proto SCTP: not TCP, UDP or ICMP"},
		{[]string{"decide", "--src", "a=b", "--dst", "c=d", "--port", "8080"}, 2, "--port needs --proto"},
		{[]string{"decide", "--src", "a=b"}, 2, "name the destination"},
		{[]string{"decide", "--src", "nokv"}, 2, "not key=value"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"decied"}, 2, "Did you mean decide?"},
		{[]string{"test", "testdata/conformance/kuma_sd.yaml"}, 0, " passed, 0 failed"},
	}
	for _, tc := range tests {
		r := runTool(t, env, nil, "verdictctl", tc.args...)
		if r.code != tc.code || !strings.Contains(r.out, tc.want) {
			t.Errorf("verdictctl %s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), r.code, tc.code, tc.want, r.out)
		}
	}
	// apply from stdin, with an error naming the document
	r := runTool(t, env, strings.NewReader("kind: Policy\nname: ok\nsources: [{}]\ndestinations: [{}]\n---\nkind: Policy\nname: bad\naction: MAYBE\nsources: [{}]\ndestinations: [{}]\n"),
		"verdictctl", "apply", "-f", "-")
	if r.code != 3 || !strings.Contains(r.out, "stdin:8:1: documents[1].action: \"MAYBE\" is not ALLOW or DENY") {
		t.Errorf("apply of an invalid document: exit %d\n%s", r.code, r.out)
	}
	// watch ends cleanly on SIGINT
	cmd := exec.Command(filepath.Join(binDir, "verdictctl"), "watch", "--server", d.addr)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "SYNCED") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), "HAS default/mesh") {
		t.Errorf("verdictctl watch: %v\n%s", err, out.String())
	}
}

// TestLargeApply: a set larger than one transaction is applied in several
// calls, and verdictctl says so.
func TestLargeApply(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	waitServing(t, d.conn(t))
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "---\nkind: Policy\nmesh: big\nname: p%d\nsources: [{match: {app: s%d}}]\ndestinations: [{match: {app: d%d}}]\n", i, i, i)
	}
	r := runTool(t, []string{"VERDICT_SERVER=" + d.addr}, strings.NewReader(b.String()), "verdictctl", "apply", "-f", "-")
	if r.code != 0 || !strings.Contains(r.out, "300 keys do not fit one transaction: writing them in 3 calls, each atomic") {
		t.Fatalf("exit %d\n%s", r.code, r.out)
	}
	// List reads the snapshot, which may lag the write: ask for the last
	// call's revision (read-your-writes).
	var rev string
	for _, line := range strings.Split(r.out, "\n") {
		if v, ok := strings.CutPrefix(line, "revision "); ok {
			rev = strings.TrimSpace(v)
		}
	}
	st := runTool(t, []string{"VERDICT_SERVER=" + d.addr}, nil, "verdictctl", "list", "--mesh", "big", "--min-revision", rev)
	if n := strings.Count(st.out, "big/policies/"); n != 300 {
		t.Errorf("%d policies listed, want 300", n)
	}
}

// TestREADMEExamples runs the grpcurl and verdictctl lines of the README as
// written, against a daemon started as `make run` starts it (only the
// address differs).
func TestREADMEExamples(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	waitServing(t, d.conn(t))
	if n := runDocExamples(t, d, "README.md"); n < 20 {
		t.Errorf("only %d README examples found", n)
	}
}

// runDocExamples runs the grpcurl and verdictctl lines of the ```sh blocks
// of a Markdown file of the repository (indented blocks of list items
// included) against d, as written but for the address, and returns how many
// it ran. A line exits 0 unless it says "# exit N"; one that says "# streams
// until Ctrl-C" runs for 2 s and must print something.
func runDocExamples(t *testing.T, d *daemon, file string) int {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := []string{"VERDICT_SERVER=" + d.addr, "PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")}
	inBlock, n := false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			inBlock = line == "```sh"
			continue
		}
		if !inBlock || !(strings.HasPrefix(line, "grpcurl ") || strings.HasPrefix(line, "verdictctl ")) {
			continue
		}
		n++
		line = strings.ReplaceAll(line, "127.0.0.1:7070", d.addr)
		streams := strings.Contains(line, "# streams until Ctrl-C")
		wantCode := 0
		if _, c, ok := strings.Cut(line, "# exit "); ok {
			if _, err := fmt.Sscanf(c, "%d", &wantCode); err != nil {
				t.Fatalf("%s: %s: %v", file, line, err)
			}
		}
		timeout := 30 * time.Second
		if streams {
			timeout = 2 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cmd := exec.CommandContext(ctx, "bash", "-c", line)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		cancel()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		switch {
		case streams:
			if len(out) == 0 {
				t.Errorf("%s: %s\nprinted nothing", file, line)
			}
		case code != wantCode:
			t.Errorf("%s: %s\nexit %d, want %d:\n%s", file, line, code, wantCode, out)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestHealthBeforeFirstSync(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	d := startDaemon(t, "--etcd-endpoints", etcdURL)
	conn := d.conn(t)
	h := healthpb.NewHealthClient(conn)
	r, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "verdict.v1.DecisionService"})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("before etcd is up: %v %v", r, err)
	}
	_, err = verdictv1.NewPolicyServiceClient(conn).Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("default", "x", "a", "b")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Apply before etcd is up: %v", err)
	}
	e, err := embedetcd.Start(ctxT(t), embedetcd.Config{Dir: t.TempDir(), ClientURL: etcdURL, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitServing(t, conn)
	if _, err := verdictv1.NewPolicyServiceClient(conn).Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("default", "x", "a", "b")}}); err != nil {
		t.Errorf("Apply once synced: %v", err)
	}
	d.stop(t) // before etcd goes
}

func TestAuthorizationToken(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("e2e-secret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "--auth-token-file", tokenFile, "--bootstrap", "examples/policies.yaml")
	conn := d.conn(t)
	waitServing(t, conn)
	pol := verdictv1.NewPolicyServiceClient(conn)
	req := &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("default", "x", "a", "b")}}
	if _, err := pol.Apply(ctxT(t), req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Apply without a token: %v", err)
	}
	bad := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer wrong")
	if _, err := pol.Apply(bad, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Apply with a wrong token: %v", err)
	}
	good := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer e2e-secret-token")
	if _, err := pol.Apply(good, req); err != nil {
		t.Errorf("Apply with the token: %v", err)
	}
	w, err := verdictv1.NewWatchServiceClient(conn).WatchResources(ctxT(t), &verdictv1.WatchResourcesRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("WatchResources without a token: %v", err)
	}
	env := []string{"VERDICT_SERVER=" + d.addr}
	if r := runTool(t, env, nil, "verdictctl", "apply", "-f", "examples/kuma-traffic-permission.yaml"); r.code != 3 || !strings.Contains(r.out, "Unauthenticated") {
		t.Errorf("verdictctl apply without a token: %d\n%s", r.code, r.out)
	}
	if r := runTool(t, env, nil, "verdictctl", "apply", "-f", "examples/kuma-traffic-permission.yaml", "--token-file", tokenFile); r.code != 0 {
		t.Errorf("verdictctl apply with the token: %d\n%s", r.code, r.out)
	}
	if r := runTool(t, env, nil, "verdictctl", "decide", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend", "--proto", "TCP", "--port", "8080"); r.code != 0 {
		t.Errorf("decide is open: %d\n%s", r.code, r.out)
	}
	if strings.Contains(d.log.String(), "e2e-secret-token") {
		t.Error("the token appears in the daemon's log")
	}
}

func TestTLSAndMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "verdict e2e CA")
	caFile := ca.Write(t, dir, "ca")
	srvCert, srvKey := ca.Server(t).Write(t, dir, "server")
	opsCert, opsKey := ca.Client(t, nil, "spiffe://verdict.test/ops").Write(t, dir, "ops")
	otherCert, otherKey := ca.Client(t, []string{"intruder.example"}).Write(t, dir, "other")
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml", "--tls-cert", srvCert, "--tls-key", srvKey,
		"--tls-client-ca", caFile, "--allow-identity", "spiffe://verdict.test/ops")
	clientTLS := &tlsFiles{ca: caFile, cert: opsCert, key: opsKey}
	waitServing(t, d.conn(t, grpc.WithTransportCredentials(clientTLS.creds(t))))
	env := []string{"VERDICT_SERVER=" + d.addr}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"mTLS identity on the list writes", []string{"apply", "-f", "examples/kuma-traffic-permission.yaml", "--tls-ca", caFile, "--tls-cert", opsCert, "--tls-key", opsKey}, 0, "legacy-to-db "},
		{"identity not on the list", []string{"status", "--tls-ca", caFile, "--tls-cert", otherCert, "--tls-key", otherKey}, 3, "PermissionDenied"},
		{"TLS without a client certificate", []string{"status", "--tls-ca", caFile}, 3, "Unauthenticated"},
		{"decisions are open over TLS", []string{"decide", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend", "--proto", "TCP", "--port", "8080", "--tls-ca", caFile}, 0, "ALLOW"},
		{"plaintext is refused", []string{"status", "--timeout", "3s"}, 3, "Unavailable"},
	}
	for _, tc := range tests {
		r := runTool(t, env, nil, "verdictctl", tc.args...)
		if r.code != tc.code || !strings.Contains(r.out, tc.want) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", tc.name, r.code, tc.code, tc.want, r.out)
		}
	}
	g := runTool(t, nil, nil, "grpcurl", "-cacert", caFile, "-cert", opsCert, "-key", opsKey, d.addr, "verdict.v1.PolicyService/Status")
	if g.code != 0 || !strings.Contains(g.out, `"synced": true`) {
		t.Errorf("grpcurl over mTLS: %d\n%s", g.code, g.out)
	}
}

func TestRefusesBeyondLoopbackWithoutAuthorization(t *testing.T) {
	t.Parallel()
	r := runTool(t, nil, nil, "verdictd", "--listen", "0.0.0.0:0", "--data-dir", t.TempDir())
	if r.code != 2 || !strings.Contains(r.out, "beyond loopback") {
		t.Errorf("exit %d\n%s", r.code, r.out)
	}
}

// tlsFiles makes client credentials from PEM files.
type tlsFiles struct{ ca, cert, key string }

func (f *tlsFiles) creds(t testing.TB) credentials.TransportCredentials {
	t.Helper()
	c, err := credentials.NewClientTLSFromFile(f.ca, "")
	if err != nil {
		t.Fatal(err)
	}
	if f.cert == "" {
		return c
	}
	cfg, err := tlsConfig(f.ca, f.cert, f.key)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(cfg)
}

// TestUnixSocket: verdictd on a Unix socket, reached by the generated client,
// grpcurl and verdictctl; the socket file goes with the daemon.
func TestUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "verdict.sock")
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml", "--listen", "unix:"+sock)
	c := d.conn(t)
	waitServing(t, c)
	resp, err := verdictv1.NewDecisionServiceClient(c).Decide(ctxT(t), &verdictv1.DecideRequest{
		Source: tags("kuma.io/service", "web"), Destination: tags("kuma.io/service", "backend"), Protocol: "TCP", Port: 8080})
	if err != nil || resp.GetAction() != verdictv1.Action_ACTION_ALLOW || resp.GetPolicy() != "web-to-backend" {
		t.Errorf("generated client: %v %v", resp, err)
	}
	// grpcurl's own -unix flag dials TCP with this gRPC version; a unix:// target works.
	dec := runTool(t, nil, nil, "grpcurl", "-plaintext", "-d", decideWebToBackend, "unix://"+sock, "verdict.v1.DecisionService/Decide")
	if dec.code != 0 || !strings.Contains(dec.out, `"policy": "web-to-backend"`) {
		t.Errorf("grpcurl unix://: %d\n%s", dec.code, dec.out)
	}
	ctl := runTool(t, nil, nil, "verdictctl", "decide", "--server", "unix:"+sock,
		"--src", "kuma.io/service=web", "--dst", "kuma.io/service=db", "--proto", "TCP", "--port", "5432")
	if ctl.code != 1 || !strings.Contains(ctl.out, "DENY by policy deny-all-to-db") {
		t.Errorf("verdictctl over the socket: %d\n%s", ctl.code, ctl.out)
	}
	d.stop(t)
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket outlived verdictd: %v", err)
	}
}

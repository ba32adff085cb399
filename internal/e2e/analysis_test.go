package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/store/embedetcd"
)

// TestAnalysisEndToEnd: a real verdictd on make run's policies and the
// verdictctl binary. reach for the database's port lists exactly the
// workloads allowed to it; impact of a DENY on an allowed flow that was
// observed (a decision the daemon logged, replayed with --flows) reports it
// and exits 1; an unrelated change exits 0; analysis decisions are not
// logged.
func TestAnalysisEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "decisions.jsonl")
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml", "--decision-log", "file:"+log)
	waitServing(t, d.conn(t))
	env := []string{"VERDICT_SERVER=" + d.addr}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// One real decision, logged: backend-1 reaches the database.
	if r := runTool(t, env, nil, "verdictctl", "decide", "--src-workload", "backend-1", "--dst-address", "10.0.3.10",
		"--proto", "TCP", "--port", "5432"); r.code != 0 {
		t.Fatalf("decide: %d\n%s", r.code, r.out)
	}
	var logged string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(log)
		if logged = strings.TrimSpace(string(b)); logged != "" {
			break
		}
	}
	if strings.Count(logged, "\n") != 0 || !strings.Contains(logged, `"backend-1"`) {
		t.Fatalf("decision log: %q", logged)
	}

	freeze := write("freeze.yaml", "kind: Policy\nname: freeze-db\npriority: -1\nsources: [{match: {kuma.io/service: backend}}]\n"+
		"destinations: [{match: {kuma.io/service: db}}]\naction: DENY\n")
	unrelated := write("unrelated.yaml", "kind: Policy\nname: cache-to-cache\nsources: [{match: {kuma.io/service: cache}}]\n"+
		"destinations: [{match: {kuma.io/service: cache}}]\n")
	cases := []struct {
		name string
		args []string
		code int
		want []string
		not  []string
	}{
		{"reach lists exactly the workloads allowed to the database's port",
			[]string{"reach", "--dst-workload", "db-1", "--proto", "TCP", "--port", "5432"}, 0,
			[]string{"Who can reach db-1 on TCP 5432", "1 workload, 0 classes outside the inventory", "backend-1  backend-to-db  backend-to-db"},
			[]string{"web-1"}},
		{"impact of a DENY on an allowed observed flow", []string{"impact", "-f", freeze, "--flows", log}, 1,
			[]string{"backend-1 -> db-1", "backend-1 -> 10.0.3.10", "ALLOW (backend-to-db)  ->  DENY (freeze-db)", "1 observed"}, nil},
		{"an unrelated change exits 0", []string{"impact", "-f", unrelated, "--flows", log}, 0, []string{"No flow changes"}, nil},
	}
	for _, tc := range cases {
		r := runTool(t, env, nil, "verdictctl", tc.args...)
		ok := r.code == tc.code
		for _, w := range tc.want {
			ok = ok && strings.Contains(r.out, w)
		}
		for _, w := range tc.not {
			ok = ok && !strings.Contains(r.out, w)
		}
		if !ok {
			t.Errorf("%s: verdictctl %s: exit %d, want %d with %q, without %q:\n%s", tc.name, strings.Join(tc.args, " "), r.code, tc.code,
				tc.want, tc.not, r.out)
		}
	}
	// Analysis decisions are not logged: a decision of a flow of its own,
	// made after the analyses, is the log's next record. The logger's one
	// goroutine writes its queue in order, so once that record is in the
	// file, any the analyses had logged would be too — a flush later than a
	// fixed wait cannot hide them.
	if r := runTool(t, env, nil, "verdictctl", "decide", "--src-workload", "web-1", "--dst-address", "10.0.3.10",
		"--proto", "TCP", "--port", "5999"); r.code != 0 && r.code != 1 {
		t.Fatalf("decide: %d\n%s", r.code, r.out)
	}
	const marker = `"port":5999`
	var lines []string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(log)
		if lines = strings.Split(strings.TrimSpace(string(b)), "\n"); strings.Contains(lines[len(lines)-1], marker) {
			break
		}
	}
	if len(lines) != 2 || lines[0] != logged || !strings.Contains(lines[1], marker) {
		t.Errorf("the decision log, want the first decision then the last (port 5999) and nothing between:\n%s", strings.Join(lines, "\n"))
	}
}

// TestFleetImpact: two verdictd on one etcd. A flow decided by one replica
// is reported by the other's impact (the fleet, by default); without
// --fleet the other replica replays its own flows only.
func TestFleetImpact(t *testing.T) {
	t.Parallel()
	e, err := embedetcd.Start(ctxT(t), embedetcd.Config{Dir: t.TempDir(), ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	a := startDaemon(t, "--etcd-endpoints", strings.Join(e.Endpoints(), ","), "--bootstrap", "examples/policies.yaml")
	waitServing(t, a.conn(t))
	b := startDaemon(t, "--etcd-endpoints", strings.Join(e.Endpoints(), ","))
	waitServing(t, b.conn(t))
	t.Cleanup(func() { a.stop(t); b.stop(t); e.Close() }) // the daemons before etcd
	if r := runTool(t, []string{"VERDICT_SERVER=" + a.addr}, nil, "verdictctl", "decide", "--src-workload", "backend-1",
		"--dst-address", "10.0.3.10", "--proto", "TCP", "--port", "5432"); r.code != 0 {
		t.Fatalf("decide on a: %d\n%s", r.code, r.out)
	}
	freeze := filepath.Join(t.TempDir(), "freeze.yaml")
	if err := os.WriteFile(freeze, []byte("kind: Policy\nname: freeze-db\npriority: -1\nsources: [{match: {kuma.io/service: backend}}]\n"+
		"destinations: [{match: {kuma.io/service: db}}]\naction: DENY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"VERDICT_SERVER=" + b.addr}
	// b lists a once a's registration is in etcd: poll until the flow shows.
	var r result
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = runTool(t, env, nil, "verdictctl", "impact", "-f", freeze); strings.Contains(r.out, "backend-1 -> 10.0.3.10") {
			break
		}
	}
	if r.code != 1 || !strings.Contains(r.out, "backend-1 -> 10.0.3.10") || !strings.Contains(r.out, "1 observed") ||
		strings.Contains(r.out, "did not answer") {
		t.Fatalf("impact on b: exit %d, want 1 with a's observed flow:\n%s", r.code, r.out)
	}
	r = runTool(t, env, nil, "verdictctl", "impact", "-f", freeze, "--fleet=false", "-o", "json")
	if r.code != 1 || strings.Contains(r.out, "10.0.3.10") {
		t.Fatalf("impact on b without the fleet: exit %d, want 1 without a's flow:\n%s", r.code, r.out)
	}
}

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// TestWatchResumes: a watch outlives a server restart, resuming from its last
// revision (finding 10): the change made while the server was down arrives,
// and stderr says it reconnects and from where.
func TestWatchResumes(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	ts.put(t, "kind: Policy\nmesh: wr\nname: before\nsources: [{}]\ndestinations: [{}]\n")
	w := c.start("watch", "--prefix", "wr/")
	w.waitFor(t, "SYNCED")
	w.waitFor(t, " wr/policies/TrafficPermission/before")
	ts.halt()
	// Written while no server runs: straight to the store.
	rs, err := resource.DecodeYAML([]byte("kind: Policy\nmesh: wr\nname: after\nsources: [{}]\ndestinations: [{}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.st.Apply(ctx, []store.Op{{Key: rs[0].Key(), Resource: rs[0]}}); err != nil {
		t.Fatal(err)
	}
	ts.restart(t)
	// A new replica holds no history before its start: it answers the resume
	// with a fresh snapshot, marked so; a replica that holds it sends the change.
	w.waitFor(t, " wr/policies/TrafficPermission/after")
	if code := w.stop(); code != 0 {
		t.Errorf("exit %d", code)
	}
	out, errOut := w.out.String(), w.errOut.String()
	if !strings.Contains(errOut, "reconnecting in") || !strings.Contains(errOut, "resuming after revision") {
		t.Errorf("stderr does not say it reconnects:\n%s", errOut)
	}
	if strings.Contains(out, "HAS wr/policies/TrafficPermission/after") && !strings.Contains(out, "SNAPSHOT (forget what came before)") {
		t.Errorf("a second snapshot not marked fresh:\n%s", out)
	}
}

// TestLogs: verdictctl logs follows the decision log with filters.
func TestLogs(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	if r := c.run(t, "kind: Policy\nmesh: lg\nname: deny-db\naction: DENY\nsources: [{}]\ndestinations: [{match: {app: db}}]\n---\n"+
		"kind: Policy\nmesh: lg\nname: allow-api\nsources: [{}]\ndestinations: [{match: {app: api}}]\n", "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %s%s", r.out, r.errOut)
	}
	ts.keys(t, "lg/")
	// Each case decides on a port of its own: the log folds a flow repeated
	// within its window into repeats records, which carry no latency. A case
	// that needs a full record (fresh) moves to a new port on every round, as
	// the follower may subscribe after the first decision of a port.
	tests := []struct {
		args    []string
		port    uint32
		fresh   bool
		want    string
		notWant string
	}{
		{[]string{"logs", "--action", "deny", "--mesh", "lg"}, 5432, false, "DENY lg/TrafficPermission app=web -> app=db TCP/5432 by deny-db", "app=api"},
		{[]string{"logs", "--workload", "api", "--mesh", "lg"}, 5432, false, "ALLOW lg/TrafficPermission app=web -> app=api TCP/5432 by allow-api", "app=db"},
		{[]string{"logs", "-o", "json", "--policy", "deny-db"}, 5433, false, `"policy":"deny-db"`, "app=api"},
		// the record's protobuf JSON: 64-bit integers as strings
		{[]string{"logs", "-o", "json", "--policy", "deny-db"}, 6000, true, `"latencyNs":"`, `"latencyNs":0`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			l := c.start(tc.args...)
			dec := verdictv1.NewDecisionServiceClient(ts.conn)
			deadline := time.Now().Add(2 * time.Minute)
			// Decide until the follower has seen a record (it may start after the first decisions).
			for round := uint32(0); !strings.Contains(l.out.String(), tc.want) && time.Now().Before(deadline); round++ {
				port := tc.port
				if tc.fresh {
					port += round
				}
				for _, dst := range []string{"api", "db"} {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := dec.Decide(ctx, &verdictv1.DecideRequest{Mesh: "lg", Source: &verdictv1.Endpoint{Tags: map[string]string{"app": "web"}},
						Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": dst}}, Protocol: "TCP", Port: port})
					cancel()
					if err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if code := l.stop(); code != 0 || !strings.Contains(l.out.String(), tc.want) || strings.Contains(l.out.String(), tc.notWant) {
				t.Errorf("exit %d, want %q and no %q:\n%s%s", code, tc.want, tc.notWant, l.out.String(), l.errOut.String())
			}
		})
	}
	if r := c.run(t, "", "logs", "--action", "maybe"); r.code != 2 {
		t.Errorf("--action maybe: exit %d", r.code)
	}
}

// TestWatchRulesAddressSets: watch rules --address-sets prints the rules with
// their peers' sets, then a delta when a workload joins a set.
func TestWatchRulesAddressSets(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	t.Cleanup(func() { c.run(t, "", "delete", "--prefix", "as/") }) // the server is shared: -count=N starts afresh
	if r := c.run(t, "kind: Policy\nmesh: as\nname: w2b\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: backend}}]\n---\n"+
		"kind: Workload\nmesh: as\nname: b1\ntags: {app: backend}\naddresses: [10.1.0.1]\n---\n"+
		"kind: Workload\nmesh: as\nname: w1\ntags: {app: web}\naddresses: [10.1.0.2]\n", "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %s%s", r.out, r.errOut)
	}
	ts.keys(t, "as/") // the replica holds b1 (apply returns when etcd does)
	w := c.start("watch", "rules", "--mesh", "as", "--workload-name", "b1", "--address-sets")
	w.waitFor(t, "workload b1: 10.1.0.1")
	w.waitFor(t, ": 10.1.0.2\n")
	if r := c.run(t, "kind: Workload\nmesh: as\nname: w2\ntags: {app: web}\naddresses: [10.1.0.3]\n", "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %s%s", r.out, r.errOut)
	}
	w.waitFor(t, ": set deltas\n")
	w.waitFor(t, ": +10.1.0.3\n")
	if code := w.stop(); code != 0 {
		t.Errorf("exit %d", code)
	}
}

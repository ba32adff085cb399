package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestDecisionLogFile: verdictd --decision-log file:PATH --decision-log-filter
// denies writes one JSON line per denied decision, none for allowed ones.
func TestDecisionLogFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml", "--decision-log", "file:"+path, "--decision-log-filter", "denies")
	conn := d.conn(t)
	waitServing(t, conn)
	dec := verdictv1.NewDecisionServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, dst := range []string{"backend", "db", "backend"} {
		req := &verdictv1.DecideRequest{}
		if err := protojson.Unmarshal([]byte(`{"source":{"tags":{"kuma.io/service":"web"}},"destination":{"tags":{"kuma.io/service":"`+
			dst+`"}},"protocol":"TCP","port":8080}`), req); err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Decide(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	var lines []string
	for ctx.Err() == nil {
		b, _ := os.ReadFile(path)
		if lines = strings.Split(strings.TrimSpace(string(b)), "\n"); len(b) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(lines) != 1 {
		t.Fatalf("%d lines, want the one denied decision: %q", len(lines), lines)
	}
	var r struct {
		RPC, Action, Policy string
		Destination         struct{ Tags map[string]string }
	}
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.RPC != "Decide" || r.Action != "DENY" || r.Destination.Tags["kuma.io/service"] != "db" {
		t.Errorf("record %+v", r)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/loadtest"
)

// TestSmokeEveryScenario runs every scenario for about a second against a real
// verdictd (built here) on an embedded etcd, and checks each report: calls
// were made, no call failed, the fan-out reached every stream, and every RPC
// scenario has its baseline ratio.
func TestSmokeEveryScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs verdictd")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "../verdictd", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	common := []string{"--verdictd", filepath.Join(dir, "verdictd"),
		"--policies", "500", "--duration", "1s", "--warmup", "200ms", "--rate", "500", "--concurrency", "8",
		"--fanout-streams", "100", "--fanout-workloads", "10", "--write-rate", "20", "--churn-rate", "500",
		"--timeout", "3m", "--json"}
	t.Run("loopback", func(t *testing.T) {
		smoke(t, dir, common, "unary/baseline", "unary/verdict", "open/verdict", "batch/verdict", "stream/verdict",
			"churn/verdict", "fanout/verdict")
	})
	t.Run("check", func(t *testing.T) {
		smoke(t, dir, append(common, "--check-rate", "300", "--check-flows", "64", "check", "check-open"),
			"check/baseline", "check/verdict", "check-open/baseline", "check-open/verdict")
	})
	t.Run("unix", func(t *testing.T) {
		smoke(t, dir, append(common, "--unix", "unary", "stream"), "unary/baseline", "unary/verdict", "stream/verdict")
	})
}

// smoke runs the load tester with args and checks its reports.
func smoke(t *testing.T, dir string, args []string, want ...string) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "verdict-loadtest"), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("verdict-loadtest: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var reports []loadtest.Report
	if err := json.Unmarshal(stdout.Bytes(), &reports); err != nil {
		t.Fatalf("reports: %v\n%s", err, stdout.String())
	}
	seen := map[string]bool{}
	for _, r := range reports {
		seen[r.Scenario+"/"+r.Target] = true
		if r.Count == 0 {
			t.Errorf("%s/%s made no call", r.Scenario, r.Target)
		}
		if len(r.Errors) > 0 {
			t.Errorf("%s/%s: errors %v", r.Scenario, r.Target, r.Errors)
		}
		if r.Target == "verdict" && r.Scenario != "churn" && r.Scenario != "fanout" && r.Ratio <= 0 {
			t.Errorf("%s: no ratio to the baseline", r.Scenario)
		}
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("no %s report", w)
		}
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "panic") {
		t.Errorf("a process panicked:\n%s", stderr.String())
	}
}

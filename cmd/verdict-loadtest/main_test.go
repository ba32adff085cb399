package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/verdictpdp/verdict/loadtest"
)

// The tests' verdictd and verdict-loadtest, built once for all of them.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds verdictd and this command once and returns their directory.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "verdict-loadtest-test-"); buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "../verdictd", ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// TestSmokeEveryScenario runs every scenario for about a second against a real
// verdictd (built here) on an embedded etcd, and checks each report: calls
// were made, no call failed, the fan-out reached every stream, and every RPC
// scenario has its baseline ratio.
func TestSmokeEveryScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs verdictd")
	}
	dir := binaries(t)
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
	t.Run("workload-churn", func(t *testing.T) {
		// With a CPU profile of verdictd taken from its loopback metrics
		// listener, started on a free port.
		profiles := t.TempDir()
		smoke(t, dir, append(common, "--workloads-loaded", "400", "--workload-rate", "50", "--workload-writers", "2",
			"--profile-dir", profiles, "workload-churn"), "workload-churn/baseline", "workload-churn/verdict")
		b, err := os.ReadFile(filepath.Join(profiles, "workload-churn.cpu.pprof"))
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("verdictd's CPU profile: %d bytes, %v; want a gzipped profile", len(b), err)
		}
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
		// Workload churn made puts and saw each one visible.
		if r.Scenario == "workload-churn" && r.Target == "verdict" &&
			(r.Notes["puts"] == "" || r.Notes["puts"] == "0" || r.Lags["put → visible"].Max <= 0) {
			t.Errorf("workload-churn: no put seen visible (notes %v, lags %v)", r.Notes, r.Lags)
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

// TestDecisionLogAB runs the decision-log comparison (issue 17) small: it must
// stop by itself and give one row per form, built from rounds alternated
// between the two verdictd processes, with the logging side's records all
// accounted for (written to the file or dropped). Timings are not asserted.
func TestDecisionLogAB(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs verdictd")
	}
	dir := binaries(t)
	logDir := t.TempDir()
	const rounds = 2
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "verdict-loadtest"), "--verdictd", filepath.Join(dir, "verdictd"),
		"--decision-log-ab", "--rounds", "2", "--decision-log-dir", logDir,
		"--policies", "200", "--duration", "300ms", "--warmup", "100ms", "--rate", "300", "--concurrency", "4",
		"--batch-size", "20", "--streams", "2", "--window", "16", "--timeout", "3m", "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("verdict-loadtest: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var res LogABResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("result: %v\n%s", err, stdout.String())
	}
	var forms []string
	for _, row := range res.Rows {
		forms = append(forms, row.Form)
		if row.Rounds != rounds {
			t.Errorf("%s: %d rounds, want %d", row.Form, row.Rounds, rounds)
		}
		if row.Off.Count == 0 || row.On.Count == 0 || row.Off.Errors+row.On.Errors > 0 {
			t.Errorf("%s: calls off %d (%d failed), on %d (%d failed)", row.Form, row.Off.Count, row.Off.Errors,
				row.On.Count, row.On.Errors)
		}
		if row.Off.P50 <= 0 || row.On.P50 <= 0 || row.P50Ratio <= 0 || row.ThroughputRatio <= 0 {
			t.Errorf("%s: missing figures: %+v", row.Form, row)
		}
		// Every recorded call decided at least one flow, and logged it.
		if row.Log.Offered < row.On.Count {
			t.Errorf("%s: %d records offered for %d calls with the log on", row.Form, row.Log.Offered, row.On.Count)
		}
		if row.Log.Written+row.Log.Dropped != row.Log.Offered || row.Lines != row.Log.Written {
			t.Errorf("%s: records offered %d, written %d, dropped %d, lines in the file %d", row.Form,
				row.Log.Offered, row.Log.Written, row.Log.Dropped, row.Lines)
		}
	}
	if got, want := strings.Join(forms, " "), strings.Join(logABForms, " "); got != want {
		t.Errorf("forms %q, want %q", got, want)
	}
	// The rounds alternate: off, on, off, on … within each form.
	if len(res.Reports) != 2*rounds*len(logABForms) {
		t.Fatalf("%d reports, want %d", len(res.Reports), 2*rounds*len(logABForms))
	}
	for i, r := range res.Reports {
		want := "verdict, decision log off"
		if i%2 == 1 {
			want = "verdict, decision log on"
		}
		if r.Target != want || r.Scenario != forms[i/(2*rounds)] {
			t.Errorf("report %d: %s/%s, want %s/%s", i, r.Scenario, r.Target, forms[i/(2*rounds)], want)
		}
	}
	if t.Failed() || strings.Contains(stderr.String(), "panic") {
		t.Logf("stderr:\n%s", stderr.String())
	}
}

// TestColdStart runs the cold-start subcommand (issue 13 item 6) small: it
// must seed, restart verdictd on the same data, find it deciding at the seeded
// revision with the answers it gave before, and report memory figures — with
// verdictd's embedded etcd, and with an etcd of the load tester's
// (--external-etcd), there with each start's profiles. Timings are not
// asserted.
func TestColdStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs verdictd")
	}
	dir := binaries(t)
	for _, external := range []bool{false, true} {
		t.Run(fmt.Sprintf("external etcd %v", external), func(t *testing.T) {
			etcdDir, pprofDir := t.TempDir(), t.TempDir()
			var stdout, stderr bytes.Buffer
			args := []string{"cold-start", "--verdictd", filepath.Join(dir, "verdictd"),
				"--workloads", "300", "--policies", "50", "--restarts", "2", "--etcd-tmpdir", etcdDir, "--timeout", "2m", "--json"}
			if external {
				args = append(args, "--external-etcd", "--profile-dir", pprofDir, "--profile-seconds", "1")
			}
			cmd := exec.Command(filepath.Join(dir, "verdict-loadtest"), args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("verdict-loadtest cold-start: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			var res ColdStartResult
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				t.Fatalf("result: %v\n%s", err, stdout.String())
			}
			if res.Workloads != 300 || res.Keys < 350 || res.Revision <= 0 || res.Empty.HeapLive <= 0 {
				t.Errorf("seeding: %+v", res)
			}
			if len(res.Starts) != 2 {
				t.Fatalf("%d starts, want 2", len(res.Starts))
			}
			for i, s := range res.Starts {
				if s.ToServing <= 0 || s.ToReady <= 0 || s.Checked == 0 || s.Memory.HeapLive <= 0 || s.Memory.RSS <= 0 ||
					s.HeapPerWorkload <= 0 || s.RSSPerWorkload <= 0 || s.AfterGC.HeapLive <= 0 || s.LivePerWorkload <= 0 {
					t.Errorf("start %d: missing figures: %+v", i+1, s)
				}
			}
			if external {
				for _, f := range []string{"cpu-start1.pb.gz", "heap-start1.pb.gz", "cpu-start2.pb.gz", "heap-start2.pb.gz"} {
					if st, err := os.Stat(filepath.Join(pprofDir, f)); err != nil || st.Size() == 0 {
						t.Errorf("profile %s: %v", f, err)
					}
				}
			}
			if entries, err := os.ReadDir(etcdDir); err != nil || slices.ContainsFunc(entries, func(e os.DirEntry) bool {
				return strings.HasPrefix(e.Name(), "verdict-cold-start")
			}) {
				t.Errorf("the etcd data directory was left behind (%v)", err)
			}
			if t.Failed() || strings.Contains(stderr.String(), "panic") {
				t.Logf("stderr:\n%s", stderr.String())
			}
		})
	}
}

package chaos

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
)

// verdictd is the binary the smoke runs start, built once by TestMain.
var verdictd string

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() || flag.Lookup("test.list").Value.String() != "" {
			return m.Run() // the smoke runs skip themselves; listing needs no binary
		}
		dir, err := os.MkdirTemp("", "verdict-chaos-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/verdictd")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: go build ./cmd/verdictd: %v\n%s", err, out)
			return 1
		}
		verdictd = filepath.Join(dir, "verdictd")
		return m.Run()
	}()
	if code == 0 {
		var opts []goleak.Option
		for _, f := range embedetcd.Lingering() {
			opts = append(opts, goleak.IgnoreAnyFunction(f))
		}
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestChaosSmoke is `make chaos` in short: every fault once (the blackhole
// aside), briefly. It asserts only what must hold whatever the machine's load
// (Report.Problems): every replica's digest equals etcd's, no acknowledged
// write is lost, no replica went back to an older snapshot, no Decide to a live
// replica failed with an error. Decide calls that ran out of their 100 ms
// deadline (Report.Misses) depend on the load — CI may share its two cores —
// and are logged with their counts; `make chaos` judges them.
func TestChaosSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes and a 3-member etcd for ~40 s: skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Verdictd: verdictd, Schedule: SmokeSchedule(), DecideRate: 100, WriteRate: 10})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.WriteText(&out)
	t.Log("\n" + out.String())
	if n := rep.FailedLive - rep.TimedOutLive; n != 0 {
		t.Errorf("%d Decide calls to live replicas failed with an error", n)
	}
	if len(rep.Misses) > 0 {
		t.Logf("latency target missed (not judged here): %v", rep.Misses)
	}
	if !rep.DigestsEqual {
		t.Error("a replica's digest differs from etcd's")
	}
	if len(rep.Writes.Lost) > 0 || rep.Writes.Acked == 0 {
		t.Errorf("%d acknowledged writes, lost: %v", rep.Writes.Acked, rep.Writes.Lost)
	}
	for _, f := range rep.Final {
		if f.Unseen > 0 || len(f.ProbeErrors) > 0 || f.Invalid != 3 {
			t.Errorf("%s: %d acknowledged writes never seen, probe errors %v, %d invalid listed (3 malformed values written)",
				f.Name, f.Unseen, f.ProbeErrors, f.Invalid)
		}
	}
	if len(rep.Problems) > 0 {
		t.Errorf("problems: %v", rep.Problems)
	}
	for _, r := range rep.Replicas {
		if r.OK == 0 {
			t.Errorf("%s answered nothing", r.Name)
		}
	}
}

// TestHostileSmoke is the hostile run of `make chaos` scaled down: every
// scenario with hundreds of streams, not thousands, and floods of seconds. It judges what holds
// whatever the load (Problems: goroutines back to the baseline, no update lost
// by the honest watcher, no Internal answers, no probe Decide failed with an
// error, no identity answered for another set, the decision log's files
// within their cap and the honest flow's decisions accounted for); probe
// deadlines, the watcher's lag and the heap are logged.
func TestHostileSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes for ~1 min: skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Hostile(ctx, HostileConfig{Verdictd: verdictd, StormStreams: 200, SilentStreams: 200, SilentFor: 4 * time.Second,
		ReadingStreams: []int{200}, ReadingFor: 2 * time.Second, Concurrent: 2, Rounds: 1,
		IdentifyFor: 2 * time.Second, IdentifyConns: 1, LogFloodFor: 2 * time.Second, LogMaxSize: 2 << 20, LogMaxFiles: 3})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.WriteText(&out)
	t.Log("\n" + out.String())
	if len(rep.Problems) > 0 {
		t.Errorf("problems: %v", rep.Problems)
	}
	if len(rep.Misses) > 0 {
		t.Logf("targets missed (not judged here): %v", rep.Misses)
	}
	if len(rep.Scenarios) != 9 || rep.Probes.OK == 0 {
		t.Errorf("%d scenarios run, %d probes answered", len(rep.Scenarios), rep.Probes.OK)
	}
	for _, s := range rep.Scenarios {
		if len(s.Codes) == 0 {
			t.Errorf("%s: the attacker made no call", s.Name)
		}
		if f := s.Identify; f != nil && (f.Registered == 0 || f.Compared == 0) {
			t.Errorf("%s: %d sets registered, %d identity answers compared", s.Name, f.Registered, f.Compared)
		}
		if f := s.Log; f != nil && (f.Lines == 0 || f.HonestDecided == 0 || f.MaxBytes == 0) {
			t.Errorf("%s: %d lines read, %d honest decisions, %d bytes at most", s.Name, f.Lines, f.HonestDecided, f.MaxBytes)
		}
	}
}

// TestSoakSmoke is `make soak` in short: 20 s of mixed load. Streams open and
// close all along; once the load stops, each replica's goroutines must come
// back to where they were before it (within idleSlack), and no call failed.
func TestSoakSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes for ~30 s: skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Soak(ctx, SoakConfig{Verdictd: verdictd, Duration: 20 * time.Second, Sample: 5 * time.Second,
		DecideRate: 100, WriteRate: 20, RuleStreams: 20, ResourceStreams: 2, DecideStreams: 2})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.WriteText(&out)
	t.Log("\n" + out.String())
	if len(rep.Problems) > 0 {
		t.Errorf("problems: %v", rep.Problems)
	}
	if len(rep.Misses) > 0 {
		t.Logf("latency target missed (not judged here): %v", rep.Misses)
	}
	for _, r := range rep.Replicas {
		if len(r.Samples) < 3 || r.IdleBefore.Goroutines == 0 || r.IdleAfter.Goroutines == 0 {
			t.Errorf("%s: samples %+v", r.Name, r)
		}
	}
	if rep.Streams["WatchRules opened"] < 20 || rep.Streams["DecideStream opened"] < 2 {
		t.Errorf("streams: %v", rep.Streams)
	}
}

// TestDigestIsTheEngines: the digest computed from raw values is the one
// engine.Snapshot.Digest computes from the same values decoded — valid
// resources and broken values alike.
func TestDigestIsTheEngines(t *testing.T) {
	t.Parallel()
	values := map[string][]byte{
		"default/mesh":                           []byte(`{"kind":"Mesh","name":"default"}`),
		"default/policies/TrafficPermission/a":   []byte(`{"kind":"Policy","name":"a","sources":[{}],"destinations":[{}]}`),
		"default/policies/TrafficPermission/bad": []byte(`{"kind":"Policy","name":`),
		"junk/x":                                 []byte("\xff"),
		"m2/scopes/S":                            []byte(`{"kind":"Scope","mesh":"m2","name":"S","selectors":[{}]}`),
	}
	var changes []engine.Change
	rev := int64(0)
	for p, v := range values {
		rev++
		changes = append(changes, store.DecodeItem(p, v, rev, rev).Change())
	}
	snap := engine.Empty().Apply(rev, changes)
	if got, want := Digest(values), snap.Digest(); got != want {
		t.Fatalf("Digest = %s, the engine's %s", got, want)
	}
}

func TestRegressions(t *testing.T) {
	t.Parallel()
	at := func(ms int) time.Time { return time.Unix(0, int64(ms)*int64(time.Millisecond)) }
	tests := []struct {
		name  string
		calls []call
		want  int
	}{
		{"in order", []call{{at(0), at(1), 5}, {at(2), at(3), 6}, {at(4), at(5), 6}}, 0},
		{"overlapping calls may disagree", []call{{at(0), at(10), 7}, {at(1), at(5), 6}}, 0},
		{"an answer older than one before it", []call{{at(0), at(1), 7}, {at(2), at(3), 6}, {at(4), at(5), 8}}, 1},
	}
	for _, tc := range tests {
		if got := regressions(tc.calls); got != tc.want {
			t.Errorf("%s: %d regressions, want %d", tc.name, got, tc.want)
		}
	}
}

// TestWriterCheck: etcd must hold the effect of each key's last
// acknowledged op, or of a later op whose outcome is unknown.
func TestWriterCheck(t *testing.T) {
	t.Parallel()
	val := func(src string) []byte {
		return []byte(`{"kind":"Policy","name":"x","sources":[{"match":{"kuma.io/service":"` + src + `"}}],"destinations":[{}]}`)
	}
	w := &writer{ops: map[string][]op{
		"k/acked":      {{src: "a", acked: true, rev: 1}},
		"k/updated":    {{src: "a", acked: true, rev: 1}, {src: "b", acked: true, rev: 2}},
		"k/unknown":    {{src: "a", acked: true, rev: 1}, {src: "b"}},
		"k/deleted":    {{src: "a", acked: true, rev: 1}, {acked: true, rev: 3}},
		"k/never":      {{src: "a"}},
		"k/lost":       {{src: "a", acked: true, rev: 4}},
		"k/stale":      {{src: "a", acked: true, rev: 1}, {src: "b", acked: true, rev: 5}},
		"k/resurrects": {{src: "a", acked: true, rev: 1}, {acked: true, rev: 6}},
	}}
	st := etcdState{Values: map[string][]byte{
		"k/acked": val("a"), "k/updated": val("b"), "k/unknown": val("b"), "k/stale": val("a"), "k/resurrects": val("a"),
	}}
	lost := w.check(st)
	var keys []string
	for _, l := range lost {
		keys = append(keys, strings.SplitN(l, ":", 2)[0])
	}
	if got, want := strings.Join(keys, " "), "k/lost k/resurrects k/stale"; got != want {
		t.Errorf("lost %q, want %q\n%s", got, want, strings.Join(lost, "\n"))
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	text := "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 42\ngo_gc_heap_live_bytes 3.5e+06\nrpc{a=\"b\"} 1\n"
	v, err := parseMetrics(strings.NewReader(text), "go_goroutines", "go_gc_heap_live_bytes")
	if err != nil || v[0] != 42 || v[1] != 3_500_000 {
		t.Fatalf("%v %v", v, err)
	}
	if _, err := parseMetrics(strings.NewReader(text), "process_resident_memory_bytes"); err == nil {
		t.Fatal("a missing metric was not reported")
	}
}

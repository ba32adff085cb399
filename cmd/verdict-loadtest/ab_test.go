package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/loadtest"
)

func TestParseBenchOutput(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/verdictpdp/verdict/engine
cpu: Some CPU
BenchmarkBuild/policies=10000-2         	      60	  19912345 ns/op	 9876543 B/op	   68000 allocs/op
BenchmarkMemory-2   	       1	1234567890 ns/op	      1888 B/policy	 12 B/op	 1 allocs/op
BenchmarkApplyOne/policies=10000        	  100000	      8730 ns/op
--- BENCH: BenchmarkSomething
    bench_test.go:10: a log line 5 ns/op
PASS
ok  	github.com/verdictpdp/verdict/engine	12.3s
`
	got := parseBenchOutput(strings.NewReader(out))
	want := map[string]float64{
		"BenchmarkBuild/policies=10000 ns/op":     19912345,
		"BenchmarkBuild/policies=10000 B/op":      9876543,
		"BenchmarkBuild/policies=10000 allocs/op": 68000,
		"BenchmarkMemory ns/op":                   1234567890,
		"BenchmarkMemory B/policy":                1888,
		"BenchmarkMemory B/op":                    12,
		"BenchmarkMemory allocs/op":               1,
		"BenchmarkApplyOne/policies=10000 ns/op":  8730,
	}
	if len(got) != len(want) {
		t.Errorf("got %d rows, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestLoadtestRows(t *testing.T) {
	reports := []*loadtest.Report{
		{Scenario: "unary", Target: "baseline", Duration: time.Second, DecisionsPerSec: 20000},
		{Scenario: "unary", Target: "verdict", Duration: time.Second, DecisionsPerSec: 18000, Ratio: 0.9,
			Latency: loadtest.Latency{P50: time.Millisecond, P99: 5 * time.Millisecond}},
		{Scenario: "churn", Target: "verdict", Duration: time.Second, DecisionsPerSec: 10000,
			Lags: map[string]loadtest.Latency{"write → visible": {P99: 20 * time.Millisecond}}},
	}
	got := loadtestRows(reports)
	want := map[string]float64{
		"loadtest unary decisions/s":            18000,
		"loadtest unary ratio-to-empty-handler": 0.9,
		"loadtest unary p50-ms":                 1,
		"loadtest unary p99-ms":                 5,
		"loadtest churn decisions/s":            10000,
		"loadtest churn p50-ms":                 0,
		"loadtest churn p99-ms":                 0,
		"loadtest churn write → visible p99-ms": 20,
	}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

func TestMedianAndDirection(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	for key, higher := range map[string]bool{
		"BenchmarkBuild ns/op":                  false,
		"BenchmarkMemory B/policy":              false,
		"loadtest unary decisions/s":            true,
		"loadtest unary ratio-to-empty-handler": true,
		"loadtest churn write → visible p99-ms": false,
	} {
		if got := higherIsBetter(key); got != higher {
			t.Errorf("higherIsBetter(%q) = %v", key, got)
		}
	}
}

func TestWriteABTable(t *testing.T) {
	base := map[string][]float64{
		"BenchmarkA ns/op":           {100, 120, 110},
		"BenchmarkGone ns/op":        {5},
		"loadtest unary decisions/s": {1000, 1200},
	}
	cur := map[string][]float64{
		"BenchmarkA ns/op":           {90, 100, 95},
		"BenchmarkNew ns/op":         {7},
		"loadtest unary decisions/s": {1100, 1100},
	}
	var b strings.Builder
	if err := writeABTable(&b, base, cur); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for _, l := range lines {
		if strings.TrimRight(l, " ") != l {
			t.Errorf("trailing spaces: %q", l)
		}
	}
	if len(lines) != 5 {
		t.Fatalf("%d lines, want a header and 4 rows:\n%s", len(lines), b.String())
	}
	for i, want := range []string{"row", "BenchmarkA ns/op", "BenchmarkGone", "BenchmarkNew", "loadtest unary"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to hold %q", i, lines[i], want)
		}
	}
	for line, want := range map[int][]string{
		1: {"lower", "110", "95", "0.864", "3/3"},
		2: {"—", "1/0"},
		4: {"higher", "1100", "1.000", "2/2"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[line], w) {
				t.Errorf("line %d = %q, want it to hold %q", line, lines[line], w)
			}
		}
	}
}

func TestABFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"make ab's defaults", []string{"--base", "HEAD~1"}, ""},
		{"no base", nil, "--base"},
		{"no rounds", []string{"--base", "x", "--rounds", "0"}, "--rounds"},
		{"nothing to compare", []string{"--base", "x", "--bench", "", "--loadtest=false"}, "nothing to compare"},
		{"the verdictd is ab's", []string{"--base", "x", "--loadtest-args", "--verdictd /bin/true"}, "set by ab"},
		{"stray arguments", []string{"--base", "x", "unary"}, "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseABFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Rounds != 8 || c.Bench != "." || c.Benchtime != "2s" || !c.Loadtest ||
				strings.Join(c.LoadtestArgs, " ") != strings.Join(makeLoadtestArgs, " ") ||
				strings.Join(c.BenchPkgs, ",") != "./engine/...,./server/" {
				t.Errorf("defaults %+v are not make bench's and make loadtest's", c)
			}
		})
	}
}

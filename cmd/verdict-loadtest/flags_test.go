package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDecisionLogABFlags: --decision-log-ab defaults to its four forms and
// refuses what it cannot compare.
func TestDecisionLogABFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantErr   string
		scenarios []string
	}{
		{"defaults to the four forms", nil, "", logABForms},
		{"a subset", []string{"batch", "stream"}, "", []string{"batch", "stream"}},
		{"a scenario it does not compare", []string{"churn"}, `scenario "churn" is not compared`, nil},
		{"an existing verdictd", []string{"--addr", "127.0.0.1:7070"}, "no --addr", nil},
		{"no rounds", []string{"--rounds", "0"}, "--rounds", nil},
		{"open loop without a rate", []string{"--rate", "0", "open"}, "needs --rate", nil},
		{"closed loop without a rate", []string{"--rate", "0", "unary"}, "", []string{"unary"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--verdictd", "/bin/true", "--decision-log-ab"}, tt.args...)
			c, err := parseFlags(args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.DecisionLogAB || !slices.Equal(c.Scenarios, tt.scenarios) {
				t.Errorf("scenarios %v (on %v), want %v", c.Scenarios, c.DecisionLogAB, tt.scenarios)
			}
		})
	}
}

// TestProfileFlags: --profile-dir needs a metrics listener to read from: the
// started verdictd gets one, an existing one (--addr) must be named.
func TestProfileFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"a started verdictd", []string{"--verdictd", "/bin/true", "--profile-dir", "p"}, ""},
		{"an existing verdictd without its metrics listener", []string{"--addr", "127.0.0.1:7070", "--profile-dir", "p"}, "needs --verdictd-metrics"},
		{"an existing verdictd with it", []string{"--addr", "127.0.0.1:7070", "--verdictd-metrics", "127.0.0.1:7071", "--profile-dir", "p"}, ""},
		{"the decision log A/B", []string{"--verdictd", "/bin/true", "--decision-log-ab", "--profile-dir", "p"}, "does not take profiles"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestCPUProfile: --cpuprofile's file holds a profile once the run stops it.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lt.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("the profile: %v, %v", fi, err)
	}
}

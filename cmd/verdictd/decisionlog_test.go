package main

import (
	"io"
	"testing"

	"github.com/verdictpdp/verdict/internal/decisionlog"
)

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64 // -1: refused
	}{
		{"100", 100}, {"100B", 100}, {"4KiB", 4 << 10}, {"4k", 4 << 10}, {"100MiB", 100 << 20}, {"100 MB", 100 << 20},
		{"1GiB", 1 << 30}, {"", -1}, {"MiB", -1}, {"-1", -1}, {"1.5MiB", -1}, {"1TiB", -1}, {"9223372036854775807GiB", -1},
	} {
		got, err := parseSize(tc.in)
		if tc.want < 0 {
			if err == nil {
				t.Errorf("%q: %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %d (%v), want %d", tc.in, got, err, tc.want)
		}
	}
	if s := formatSize(100 << 20); s != "100MiB" {
		t.Errorf("formatSize: %s", s)
	}
}

// The decision log's bounds have documented defaults, environment mirrors
// and flags.
func TestDecisionLogBoundFlags(t *testing.T) {
	t.Parallel()
	c, err := parseFlags(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.DecisionLogMaxSize != 100<<20 || c.DecisionLogMaxFiles != 10 || c.DecisionLogMaxRecord != decisionlog.DefaultMaxRecordBytes ||
		c.DecisionLogRepeatWindow != decisionlog.DefaultRepeatWindow {
		t.Errorf("defaults %d %d %d %v", c.DecisionLogMaxSize, c.DecisionLogMaxFiles, c.DecisionLogMaxRecord, c.DecisionLogRepeatWindow)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	env := map[string]string{"VERDICT_DECISION_LOG_MAX_SIZE": "2MiB", "VERDICT_DECISION_LOG_MAX_FILES": "3"}
	c, err = parseFlags([]string{"--decision-log-max-size", "1MiB", "--decision-log-max-record", "2KiB",
		"--decision-log-repeats-window", "0"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.DecisionLogMaxSize != 1<<20 || c.DecisionLogMaxFiles != 3 || c.DecisionLogMaxRecord != 2<<10 || c.DecisionLogRepeatWindow != 0 {
		t.Errorf("flags and environment: %d %d %d %v", c.DecisionLogMaxSize, c.DecisionLogMaxFiles, c.DecisionLogMaxRecord,
			c.DecisionLogRepeatWindow)
	}
	if _, err := parseFlags([]string{"--decision-log-max-size", "lots"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("a size that is not one was accepted")
	}
}

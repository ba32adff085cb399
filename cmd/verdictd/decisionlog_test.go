package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

// --decision-log file:PATH with the bounds' flags: the file rotates within
// max-files × max-size, and a repeats window of 0 writes every decision.
func TestDecisionLogFileBounds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "d.jsonl")
	c := Config{DecisionLog: "file:" + path, DecisionLogFilter: "all", DecisionLogSample: 1, DecisionLogQueue: 100_000,
		DecisionLogMaxSize: 64 << 10, DecisionLogMaxFiles: 2, DecisionLogMaxRecord: 4 << 10}
	l, err := newDecisionLog(context.Background(), c, func(string) string { return "" }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	for i := range 2000 { // about 400 KB of records, all of one flow
		if l.Repeat(1) {
			t.Fatal("a repeat counted with the window off")
		}
		l.Log(1, &decisionlog.Record{Mesh: "default", Rpc: "Decide", Revision: int64(i), Policy: strings.Repeat("p", 150)})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if info, _ := e.Info(); info.Size() > 64<<10 {
			t.Errorf("%s: %d bytes", e.Name(), info.Size())
		}
	}
	if strings.Join(names, " ") != "d.jsonl d.jsonl.1" {
		t.Errorf("files %v, want d.jsonl and d.jsonl.1", names)
	}
}

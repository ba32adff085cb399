package loadtest

import (
	"strings"
	"testing"
	"time"
)

func TestParseLogCounters(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    LogCounters
		wantErr bool
	}{
		{"no decision log", "# HELP go_goroutines x\ngo_goroutines 12\n", LogCounters{}, false},
		{"plain and labelled, summed", `# TYPE verdict_decision_log_offered_total counter
verdict_decision_log_offered_total{otel_scope_name="verdict"} 1200
verdict_decision_log_written_total 1100
verdict_decision_log_dropped_total{a="1"} 60
verdict_decision_log_dropped_total{a="2"} 40
verdict_decision_log_sink_errors_total 0
verdict_decision_log_queue_depth 3
verdict_decision_log_offered_total_other 99
`, LogCounters{Offered: 1200, Written: 1100, Dropped: 100, QueueDepth: 3}, false},
		{"exponent", "verdict_decision_log_written_total 1.5e+06\n", LogCounters{Written: 1500000}, false},
		{"no value", "verdict_decision_log_written_total\n", LogCounters{}, true},
		{"not a number", "verdict_decision_log_written_total{x=\"}\"} many\n", LogCounters{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLogCounters(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLogABSummarize(t *testing.T) {
	rep := func(p50 time.Duration, perSec float64) *Report {
		return &Report{Mode: "closed loop, concurrency 8", Count: 10, Duration: time.Second, DecisionsPerSec: perSec,
			Latency: Latency{P50: p50, P99: 2 * p50}}
	}
	off := []*Report{rep(100*time.Microsecond, 1000), rep(300*time.Microsecond, 3000), rep(200*time.Microsecond, 2000)}
	on := []*Report{rep(400*time.Microsecond, 1000), rep(400*time.Microsecond, 1000)}
	row := LogABSummarize("unary", off, on, LogCounters{Written: 5}, 5)
	if row.Rounds != 2 || row.Off.P50 != 200*time.Microsecond || row.On.P50 != 400*time.Microsecond ||
		row.Off.DecisionsPerSec != 2000 || row.On.DecisionsPerSec != 1000 || row.P50Ratio != 2 ||
		row.ThroughputRatio != 0.5 || row.Off.Count != 30 {
		t.Errorf("row %+v", row)
	}
	var b strings.Builder
	WriteLogABTable(&b, []LogABRow{row, LogABSummarize("open", off, on, LogCounters{Dropped: 7}, 0)})
	for _, want := range []string{"unary", "0.500", "7 records DROPPED"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// Package loadtest measures a running verdictd over gRPC, like ghz: unary
// Decide in closed and open loop, DecideBatch, DecideStream, policy churn and
// workload churn while deciding, WatchRules fan-out, and the same harness against an empty handler
// (the ceiling). Every run is bounded in time and count and stops by itself.
// cmd/verdict-loadtest is its command line.
package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Latency summarizes a histogram.
type Latency struct {
	P50  time.Duration `json:"p50"`
	P90  time.Duration `json:"p90"`
	P99  time.Duration `json:"p99"`
	P999 time.Duration `json:"p999"`
	Max  time.Duration `json:"max"`
	Mean time.Duration `json:"mean"`
}

func summarize(h *Histogram) Latency {
	return Latency{P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), P999: h.Quantile(0.999),
		Max: h.Max(), Mean: h.Mean()}
}

// Report is the result of one scenario.
type Report struct {
	Scenario string `json:"scenario"`
	Target   string `json:"target"` // "verdict" or "baseline"
	Mode     string `json:"mode"`   // "closed loop, concurrency 32", "open loop, 10000/s"
	// Count of completed calls (answered, with or without an error).
	Count    int64         `json:"count"`
	Duration time.Duration `json:"duration"`
	// RPS is completed calls per second.
	RPS float64 `json:"rps"`
	// DecisionsPerSec counts flows decided (a batch call decides many).
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	Latency         Latency `json:"latency"`
	// Errors by gRPC status code name.
	Errors map[string]int64 `json:"errors,omitempty"`
	// BaselineDecisionsPerSec and Ratio: the empty handler's throughput with the
	// same settings in the same run, and this scenario's share of it.
	BaselineDecisionsPerSec float64 `json:"baselineDecisionsPerSec,omitempty"`
	Ratio                   float64 `json:"ratio,omitempty"`
	// Late counts open-loop sends that started more than 1 ms after their
	// intended time (their latency counts from the intended time anyway).
	Late int64 `json:"late,omitempty"`
	// Lags are scenario-specific latency summaries: churn's write → visible,
	// fan-out's change → delivered.
	Lags map[string]Latency `json:"lags,omitempty"`
	// Notes are scenario-specific figures.
	Notes map[string]string `json:"notes,omitempty"`
}

// ErrorCount returns the number of calls that failed.
func (r *Report) ErrorCount() int64 {
	var n int64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// WriteText prints the report like ghz does.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "\n%s — %s (%s)\n", r.Scenario, r.Target, r.Mode)
	if r.Duration > 0 {
		fmt.Fprintf(w, "  count %d in %v: %.0f calls/s", r.Count, r.Duration.Round(time.Millisecond), r.RPS)
		if r.DecisionsPerSec != r.RPS {
			fmt.Fprintf(w, ", %.0f decisions/s", r.DecisionsPerSec)
		}
		fmt.Fprintln(w)
	}
	if r.Ratio > 0 {
		fmt.Fprintf(w, "  vs empty handler (same run): %.0f decisions/s, ratio %.2f\n", r.BaselineDecisionsPerSec, r.Ratio)
	}
	if r.Count > 0 && r.Duration > 0 {
		l := r.Latency
		fmt.Fprintf(w, "  latency p50 %v  p90 %v  p99 %v  p99.9 %v  max %v  mean %v\n",
			round(l.P50), round(l.P90), round(l.P99), round(l.P999), round(l.Max), round(l.Mean))
	}
	if r.Late > 0 {
		fmt.Fprintf(w, "  late sends (> 1 ms behind schedule): %d\n", r.Late)
	}
	names := make([]string, 0, len(r.Lags))
	for n := range r.Lags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		l := r.Lags[n]
		fmt.Fprintf(w, "  %s: p50 %v  p99 %v  max %v\n", n, round(l.P50), round(l.P99), round(l.Max))
	}
	notes := make([]string, 0, len(r.Notes))
	for n := range r.Notes {
		notes = append(notes, n)
	}
	sort.Strings(notes)
	for _, n := range notes {
		fmt.Fprintf(w, "  %s: %s\n", n, r.Notes[n])
	}
	if len(r.Errors) == 0 {
		fmt.Fprintln(w, "  errors: none")
		return
	}
	var parts []string
	for code, n := range r.Errors {
		parts = append(parts, fmt.Sprintf("%s %d", code, n))
	}
	sort.Strings(parts)
	fmt.Fprintf(w, "  errors: %s\n", strings.Join(parts, ", "))
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Second:
		return d.Round(time.Millisecond)
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond / 10)
}

// WriteJSON prints reports as a JSON array.
func WriteJSON(w io.Writer, reports []*Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(reports)
}

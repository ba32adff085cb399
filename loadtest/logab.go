package loadtest

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// LogCounters are the decision log's counters of one verdictd, read from its
// Prometheus /metrics (verdict_decision_log_*_total).
type LogCounters struct {
	Offered    int64 `json:"offered"`
	Written    int64 `json:"written"`
	Dropped    int64 `json:"dropped"`
	SinkErrors int64 `json:"sinkErrors"`
	QueueDepth int64 `json:"queueDepth"`
}

// Sub returns the counters' growth from before to c (the depth is c's).
func (c LogCounters) Sub(before LogCounters) LogCounters {
	return LogCounters{Offered: c.Offered - before.Offered, Written: c.Written - before.Written,
		Dropped: c.Dropped - before.Dropped, SinkErrors: c.SinkErrors - before.SinkErrors, QueueDepth: c.QueueDepth}
}

// Settled reports whether every record offered was written or dropped: the
// queue is empty and no batch is being written.
func (c LogCounters) Settled() bool {
	return c.QueueDepth == 0 && c.Offered == c.Written+c.Dropped
}

// ParseLogCounters reads the decision log's counters from a Prometheus text
// exposition, summing over label sets. A verdictd without a decision log has
// none of them: all zero.
func ParseLogCounters(r io.Reader) (LogCounters, error) {
	var c LogCounters
	fields := map[string]*int64{
		"verdict_decision_log_offered_total":     &c.Offered,
		"verdict_decision_log_written_total":     &c.Written,
		"verdict_decision_log_dropped_total":     &c.Dropped,
		"verdict_decision_log_sink_errors_total": &c.SinkErrors,
		"verdict_decision_log_queue_depth":       &c.QueueDepth,
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		dst, ok := fields[name]
		if !ok {
			continue
		}
		rest := line[len(name):]
		if strings.HasPrefix(rest, "{") {
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return c, fmt.Errorf("metrics: %q: no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return c, fmt.Errorf("metrics: %q: %w", line, err)
		}
		*dst += int64(v)
	}
	return c, sc.Err()
}

// LogABSide is one side (decision log off or on) of a form over all its rounds:
// the medians of the rounds' p50 and p99, and decisions over the summed
// measured time.
type LogABSide struct {
	P50             time.Duration `json:"p50"`
	P99             time.Duration `json:"p99"`
	DecisionsPerSec float64       `json:"decisionsPerSec"`
	Count           int64         `json:"count"`
	Errors          int64         `json:"errors"`
	Late            int64         `json:"late,omitempty"`
}

// LogABRow compares one form (unary closed loop, unary open loop, batch,
// stream) with every decision logged and without, measured in alternated
// rounds against two verdictd processes on the same machine.
type LogABRow struct {
	Form   string    `json:"form"`
	Mode   string    `json:"mode"`
	Rounds int       `json:"rounds"`
	Off    LogABSide `json:"off"`
	On     LogABSide `json:"on"`
	// P50Ratio and ThroughputRatio are on ÷ off.
	P50Ratio        float64 `json:"p50Ratio"`
	ThroughputRatio float64 `json:"throughputRatio"`
	// Log is the logging verdictd's counters over this form's rounds (warm-up
	// calls included: they are decided and logged too); Lines the JSON lines
	// its file received.
	Log   LogCounters `json:"log"`
	Lines int64       `json:"lines"`
}

// LogABSummarize builds a form's row from its rounds' reports.
func LogABSummarize(form string, off, on []*Report, log LogCounters, lines int64) LogABRow {
	row := LogABRow{Form: form, Rounds: min(len(off), len(on)), Off: side(off), On: side(on), Log: log, Lines: lines}
	if len(on) > 0 {
		row.Mode = on[0].Mode
	}
	if row.Off.P50 > 0 {
		row.P50Ratio = float64(row.On.P50) / float64(row.Off.P50)
	}
	if row.Off.DecisionsPerSec > 0 {
		row.ThroughputRatio = row.On.DecisionsPerSec / row.Off.DecisionsPerSec
	}
	return row
}

func side(rs []*Report) LogABSide {
	var s LogABSide
	var p50s, p99s []time.Duration
	var decisions float64
	var elapsed time.Duration
	for _, r := range rs {
		p50s, p99s = append(p50s, r.Latency.P50), append(p99s, r.Latency.P99)
		decisions += r.DecisionsPerSec * r.Duration.Seconds()
		elapsed += r.Duration
		s.Count += r.Count
		s.Errors += r.ErrorCount()
		s.Late += r.Late
	}
	s.P50, s.P99 = median(p50s), median(p99s)
	if elapsed > 0 {
		s.DecisionsPerSec = decisions / elapsed.Seconds()
	}
	return s
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	if len(ds)%2 == 1 {
		return ds[len(ds)/2]
	}
	return (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
}

// WriteLogABTable prints the rows as one table: per form, p50, p99 and
// decisions/s off and on, the ratios, and the log's counters beside them.
func WriteLogABTable(w io.Writer, rows []LogABRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "form\tp50 off\tp50 on\tp50 on/off\tp99 off\tp99 on\tdecisions/s off\tdecisions/s on\tthroughput on/off\tlogged\tlines\tdropped\tsink errors\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%v\t%v\t%.3f\t%v\t%v\t%.0f\t%.0f\t%.3f\t%d\t%d\t%d\t%d\t\n", r.Form,
			round(r.Off.P50), round(r.On.P50), r.P50Ratio, round(r.Off.P99), round(r.On.P99),
			r.Off.DecisionsPerSec, r.On.DecisionsPerSec, r.ThroughputRatio, r.Log.Written, r.Lines, r.Log.Dropped, r.Log.SinkErrors)
	}
	tw.Flush()
	for _, r := range rows {
		fmt.Fprintf(w, "  %s: %s, %d rounds each side", r.Form, r.Mode, r.Rounds)
		if r.Off.Errors+r.On.Errors > 0 {
			fmt.Fprintf(w, "; failed calls: off %d, on %d", r.Off.Errors, r.On.Errors)
		}
		if r.Off.Late+r.On.Late > 0 {
			fmt.Fprintf(w, "; late sends: off %d, on %d", r.Off.Late, r.On.Late)
		}
		if r.Log.Dropped > 0 {
			hint := "the closed loop outran the log"
			if strings.HasPrefix(r.Mode, "open") {
				hint = "lower --rate"
			}
			fmt.Fprintf(w, "; %d records DROPPED: not a figure at a rate where none is (%s)", r.Log.Dropped, hint)
		}
		fmt.Fprintln(w)
	}
}

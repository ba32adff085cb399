package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/internal/listen"
	"github.com/verdictpdp/verdict/loadtest"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// logABForms are the forms the decision-log comparison measures (issue 17
// item 4): unary in closed and open loop, batch and stream.
var logABForms = []string{"unary", "open", "batch", "stream"}

// logABTarget is one started verdictd of the comparison.
type logABTarget struct {
	proc    *process
	conns   loadtest.Conns
	metrics string // http://127.0.0.1:PORT/metrics
	logFile string // the JSON-lines file; empty on the side without the log
}

// LogABResult is what --decision-log-ab prints with --json: the table's rows
// and every round's report, in the order they ran.
type LogABResult struct {
	Rows    []loadtest.LogABRow `json:"rows"`
	Reports []*loadtest.Report  `json:"reports"`
}

// RunDecisionLogAB starts two verdictd processes, each on an embedded etcd of
// its own, one logging every decision to a JSON-lines file (filter all, sample
// 1) and one without a decision log, loads the same policies into both, and
// runs each form against them in alternated rounds (off, on, off, on …). After
// each round on the logging side it waits for the log to settle (every
// offered record written or dropped), reads its counters from /metrics and
// the file's lines, and empties the file (so the disk holds one round at
// most). ok is false when a call failed or the log's counters disagree.
func RunDecisionLogAB(ctx context.Context, cfg Config, stdout, stderr io.Writer) (ok bool, err error) {
	dir, err := os.MkdirTemp(cfg.LogDir, "verdict-loadtest-declog")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	off, err := startLogABTarget(ctx, cfg, "", stderr)
	if err != nil {
		return false, fmt.Errorf("start verdictd without a decision log: %w", err)
	}
	defer off.close()
	on, err := startLogABTarget(ctx, cfg, filepath.Join(dir, "decisions.jsonl"), stderr)
	if err != nil {
		return false, fmt.Errorf("start verdictd with a decision log: %w", err)
	}
	defer on.close()

	set := policygen.Generate(policygen.Config{Seed: cfg.Seed, Policies: cfg.Policies, Scopes: cfg.Scopes})
	flows := loadtest.Flows(set.Flows(cfg.Seed+1, 8192))
	for _, t := range []*logABTarget{off, on} {
		rev, err := load(ctx, t.conns[0], set.Resources)
		if err != nil {
			return false, fmt.Errorf("load %d policies: %w", cfg.Policies, err)
		}
		warm := flows[0]
		warm.MinRevision = rev
		_, err = verdictv1.NewDecisionServiceClient(t.conns[0]).Decide(ctx, warm)
		warm.MinRevision = 0
		if err != nil {
			return false, fmt.Errorf("wait for revision %d: %w", rev, err)
		}
	}
	// The rounds count from an empty file: the warm-up decision's record goes.
	if _, err := on.settled(ctx); err != nil {
		return false, err
	}
	if _, err := on.takeLines(); err != nil {
		return false, err
	}
	fmt.Fprintf(stderr, "loaded %d policies into both verdictd processes; %d rounds per form\n", cfg.Policies, cfg.Rounds)

	lim := loadtest.Limits{Duration: cfg.Duration, Requests: cfg.Requests, Warmup: cfg.Warmup}
	runForm := func(form string, c loadtest.Conns) *loadtest.Report {
		switch form {
		case "unary":
			return loadtest.Unary(ctx, c, flows, cfg.Concurrency, 0, lim)
		case "open":
			return loadtest.Unary(ctx, c, flows, 0, cfg.Rate, lim)
		case "batch":
			return loadtest.Batch(ctx, c, flows, max(2, cfg.Concurrency/8), cfg.BatchSize, lim)
		default:
			return loadtest.Stream(ctx, c, flows, cfg.Streams, cfg.Window, lim)
		}
	}
	var res LogABResult
	ok = true
	for _, form := range cfg.Scenarios {
		var offs, ons []*loadtest.Report
		var counters loadtest.LogCounters
		var lines int64
		for round := 0; round < cfg.Rounds && ctx.Err() == nil; round++ {
			r := runForm(form, off.conns)
			r.Target = "verdict, decision log off"
			offs = append(offs, r)
			res.Reports = append(res.Reports, r)

			before, err := on.settled(ctx)
			if err != nil {
				return false, err
			}
			r = runForm(form, on.conns)
			r.Target = "verdict, decision log on"
			ons = append(ons, r)
			res.Reports = append(res.Reports, r)
			after, err := on.settled(ctx)
			if err != nil {
				return false, err
			}
			d := after.Sub(before)
			counters.Offered += d.Offered
			counters.Written += d.Written
			counters.Dropped += d.Dropped
			counters.SinkErrors += d.SinkErrors
			n, err := on.takeLines()
			if err != nil {
				return false, err
			}
			lines += n
		}
		if ctx.Err() != nil {
			break
		}
		row := loadtest.LogABSummarize(form, offs, ons, counters, lines)
		if row.Off.Errors+row.On.Errors > 0 || row.Log.Written != row.Lines || row.Log.SinkErrors > 0 {
			ok = false
		}
		res.Rows = append(res.Rows, row)
	}
	// The side without a decision log must have logged nothing: the comparison
	// would be of two logging processes otherwise.
	if c, err := off.counters(ctx); err != nil {
		return false, err
	} else if c.Offered != 0 {
		return false, fmt.Errorf("the verdictd without a decision log offered %d records to one", c.Offered)
	}
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return ok, enc.Encode(res)
	}
	fmt.Fprintf(stdout, "verdict-loadtest --decision-log-ab: %d policies, %d connections; decision log off vs on "+
		"(every decision to a JSON-lines file: filter all, sample 1), rounds alternated off, on, off, on …\n"+
		"p50/p99: median of the rounds; decisions/s: over the rounds' measured time; logged: records written "+
		"(verdict_decision_log_written_total), lines: the file's; dropped: verdict_decision_log_dropped_total\n\n",
		cfg.Policies, cfg.Connections)
	loadtest.WriteLogABTable(stdout, res.Rows)
	return ok, ctx.Err()
}

// startLogABTarget starts a verdictd serving metrics on a free loopback port,
// logging every decision to logFile unless it is empty.
func startLogABTarget(ctx context.Context, cfg Config, logFile string, stderr io.Writer) (*logABTarget, error) {
	ports, err := listen.FreePorts(1)
	if err != nil {
		return nil, err
	}
	maddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	args := []string{"--listen", listenArg(cfg), "--metrics-listen", maddr, "--data-dir", "", "--log-level", "warn"}
	if logFile != "" {
		// Every decision written (no repeats folded), into one file that
		// takeLines empties (no rotation).
		args = append(args, "--decision-log", "file:"+logFile, "--decision-log-filter", "all", "--decision-log-sample", "1",
			"--decision-log-repeats-window", "0", "--decision-log-max-size", "1024GiB")
	}
	p, err := startProcess(ctx, cfg.Verdictd, cfg.EtcdParent, stderr, args...)
	if err != nil {
		return nil, err
	}
	t := &logABTarget{proc: p, metrics: "http://" + maddr + "/metrics", logFile: logFile}
	if t.conns, err = dial(p.addr, cfg.Connections); err != nil {
		p.stop()
		return nil, err
	}
	if err := waitServing(ctx, t.conns[0]); err != nil {
		t.close()
		return nil, fmt.Errorf("verdictd at %s: %w", p.addr, err)
	}
	return t, nil
}

func (t *logABTarget) close() {
	closeAll(t.conns)
	t.proc.stop()
}

// counters reads the decision log's counters from the verdictd's /metrics.
func (t *logABTarget) counters(ctx context.Context) (loadtest.LogCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.metrics, nil)
	if err != nil {
		return loadtest.LogCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return loadtest.LogCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return loadtest.LogCounters{}, fmt.Errorf("%s: %s", t.metrics, resp.Status)
	}
	return loadtest.ParseLogCounters(resp.Body)
}

// settled waits, 30 s at most, until every record offered to the log was
// written or dropped, and returns the counters then.
func (t *logABTarget) settled(ctx context.Context) (loadtest.LogCounters, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := t.counters(ctx)
		if err != nil {
			return c, err
		}
		if c.Settled() {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return c, fmt.Errorf("decision log did not settle: %+v", c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// takeLines counts the log file's lines and empties it (verdictd appends, so
// its next write lands at the new end).
func (t *logABTarget) takeLines() (int64, error) {
	f, err := os.OpenFile(t.logFile, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // truncated by a syscall: nothing buffered to lose
	var n int64
	buf := make([]byte, 1<<20)
	for {
		k, err := f.Read(buf)
		n += int64(bytes.Count(buf[:k], []byte{'\n'}))
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, err
		}
	}
	return n, f.Truncate(0)
}

package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/verdictpdp/verdict/loadtest"
	"google.golang.org/grpc/codes"
)

// Report is a chaos run's result, judged in two parts. Problems break a
// promise whatever the machine's load: a replica's digest differs from etcd's,
// an acknowledged write is missing (from etcd, from a replica's snapshot, or
// from its decisions), a replica answered from an older snapshot than an
// earlier answer, a live replica's health said NOT_SERVING or a Decide to it
// failed with anything but its deadline. Misses are the latency target: Decide
// calls and health checks to live replicas that ran out of their deadline —
// on a busy machine a process can be starved of CPU, so a test on a shared
// machine reports them with their counts and judges only Problems. Pass is
// true when there is neither (what `make chaos` prints).
type Report struct {
	Started       time.Time     `json:"started"`
	Duration      time.Duration `json:"duration"`
	Topology      string        `json:"topology"`
	DecideRate    float64       `json:"decideRatePerReplica"`
	DecideTimeout time.Duration `json:"decideTimeout"`
	WriteRate     float64       `json:"writeRate"`
	SeedRevision  int64         `json:"seedRevision"`
	Schedule      []Step        `json:"schedule"`
	Steps         []StepReport  `json:"steps"`

	Replicas []ReplicaReport `json:"replicas"`
	Writes   WriteStats      `json:"writes"`
	Etcd     EtcdReport      `json:"etcd"`
	Final    []FinalReplica  `json:"final"`

	// The headline figures.
	FailedLive         int64       `json:"failedDecideCallsToLiveReplicas"`
	TimedOutLive       int64       `json:"timedOutDecideCallsToLiveReplicas"` // of FailedLive, those that ran out of their deadline
	LongestStaleServed StalePeriod `json:"longestStaleServed"`
	LongestStaleFlag   StalePeriod `json:"longestStaleFlag"`
	DigestsEqual       bool        `json:"digestsEqual"`

	Pass     bool     `json:"pass"`
	Problems []string `json:"problems,omitempty"`
	Misses   []string `json:"misses,omitempty"`

	lost   []string
	probed int
}

// ReplicaReport is one replica's figures over the run.
type ReplicaReport struct {
	Name      string `json:"name"`
	Endpoints string `json:"etcdEndpoints"`
	Starts    int64  `json:"starts"`
	// Decide calls: sent, answered, and failed by the replica's state.
	Sent           int64            `json:"sent"`
	OK             int64            `json:"ok"`
	FailedLive     int64            `json:"failedLive"`
	FailedLiveBy   map[string]int64 `json:"failedLiveByCode,omitempty"`
	KilledInFlight int64            `json:"killedInFlight"`
	SentWhileDown  int64            `json:"sentWhileDown"`
	DownAnswered   int64            `json:"downAnswered"`
	Skipped        int64            `json:"skipped,omitempty"`
	Latency        loadtest.Latency `json:"latency"` // answered calls to the live replica
	Failures       []Failure        `json:"failures,omitempty"`
	// Staleness: per acknowledged write, how long the replica served without
	// it (time live between the acknowledgment and an answer at or after its
	// revision).
	StaleServed       loadtest.Latency `json:"staleServed"`
	WorstStaleServed  StalePeriod      `json:"worstStaleServed"`
	LongestStaleFlag  StalePeriod      `json:"longestStaleFlag"` // Status.stale = true, continuously
	StatusPolls       int64            `json:"statusPolls"`
	StatusPollErrors  int64            `json:"statusPollErrors"`
	HealthChecks      int64            `json:"healthChecks"`
	HealthNotServing  int64            `json:"healthNotServing"` // while live: must be 0
	HealthTimedOut    int64            `json:"healthTimedOut"`   // while live: checks that ran out of their deadline
	RevisionRegressed int              `json:"revisionRegressions"`
}

// EtcdReport is etcd's state at the final check.
type EtcdReport struct {
	Revision    int64  `json:"revision"`
	Digest      string `json:"digest"`
	Keys        int    `json:"keys"`
	Compactions int    `json:"compactions"`
}

// FinalReplica is one replica at the final check.
type FinalReplica struct {
	Name        string        `json:"name"`
	Revision    int64         `json:"revision"`
	Digest      string        `json:"digest"`
	DigestEqual bool          `json:"digestEqual"`
	Stale       bool          `json:"stale"`
	Invalid     int           `json:"invalid"`
	CaughtUpIn  time.Duration `json:"caughtUpIn"`
	Unseen      int           `json:"unseenWrites"` // acknowledged writes it never answered at or after
	ProbeErrors []string      `json:"probeErrors,omitempty"`
	Error       string        `json:"error,omitempty"`
}

func summarize(h *loadtest.Histogram) loadtest.Latency {
	return loadtest.Latency{P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), P999: h.Quantile(0.999),
		Max: h.Max(), Mean: h.Mean()}
}

// collect fills the figures in and judges the run.
func (rep *Report) collect(c *run, d *deciders) {
	rep.Writes = c.writer.snapshotStats()
	rep.Writes.Lost = rep.lost
	rep.Writes.Probed = rep.probed
	c.env.mu.Lock()
	rep.Etcd.Compactions = c.env.compactions
	c.env.mu.Unlock()
	c.obs.mu.Lock()
	for i, r := range c.env.replicas {
		st, s := d.stats[i], c.obs.state[r]
		st.mu.Lock()
		rr := ReplicaReport{Name: r.name, Endpoints: strings.Join(r.endpoints, ","), Starts: r.starts.Load(),
			Sent: st.sent, OK: st.ok, FailedLiveBy: st.liveFailed, KilledInFlight: st.killedInFlight,
			SentWhileDown: st.down, DownAnswered: st.downOK, Skipped: st.skipped, Latency: summarize(&st.latency),
			Failures: st.failures, StaleServed: summarize(&s.lag), WorstStaleServed: s.worst, LongestStaleFlag: s.stale,
			StatusPolls: s.polls, StatusPollErrors: s.pollErrs, HealthChecks: s.healthChecks, HealthNotServing: s.notServing, HealthTimedOut: s.healthTimedOut,
			RevisionRegressed: regressions(append(append([]call(nil), st.calls...), s.status...))}
		st.mu.Unlock()
		if !s.staleRun.IsZero() { // still stale at the end
			if d := s.last.Sub(s.staleRun); d > rr.LongestStaleFlag.Duration {
				rr.LongestStaleFlag = StalePeriod{Duration: d, Phase: s.staleAt}
			}
		}
		for _, n := range rr.FailedLiveBy {
			rr.FailedLive += n
		}
		rep.FailedLive += rr.FailedLive
		rep.TimedOutLive += rr.FailedLiveBy[codes.DeadlineExceeded.String()]
		if rr.WorstStaleServed.Duration >= rep.LongestStaleServed.Duration {
			rep.LongestStaleServed = rr.WorstStaleServed
			rep.LongestStaleServed.Phase = r.name + ": " + rr.WorstStaleServed.Phase
		}
		if rr.LongestStaleFlag.Duration >= rep.LongestStaleFlag.Duration {
			rep.LongestStaleFlag = rr.LongestStaleFlag
			rep.LongestStaleFlag.Phase = r.name + ": " + rr.LongestStaleFlag.Phase
		}
		rep.Replicas = append(rep.Replicas, rr)
		for i := range rep.Steps {
			st := &rep.Steps[i]
			if st.StaleServed == nil {
				st.StaleServed, st.StaleFlag = map[string]time.Duration{}, map[string]time.Duration{}
			}
			for _, after := range []bool{false, true} {
				p := phaseOf(st.Step, st.Fault, after)
				st.StaleServed[r.name] = max(st.StaleServed[r.name], s.byPhase[p])
				st.StaleFlag[r.name] = max(st.StaleFlag[r.name], s.flagBy[p])
			}
		}
		if rr.HealthNotServing > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: health was not SERVING %d times while it lived", r.name, rr.HealthNotServing))
		}
		if rr.HealthTimedOut > 0 {
			rep.Misses = append(rep.Misses, fmt.Sprintf("%s: %d health checks ran out of their deadline", r.name, rr.HealthTimedOut))
		}
		if rr.RevisionRegressed > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s answered %d times from an older snapshot than an earlier answer", r.name, rr.RevisionRegressed))
		}
	}
	c.obs.mu.Unlock()

	if n := rep.FailedLive - rep.TimedOutLive; n > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d Decide calls to live replicas failed with an error (%d more ran out of their deadline)", n, rep.TimedOutLive))
	}
	if rep.TimedOutLive > 0 {
		rep.Misses = append(rep.Misses, fmt.Sprintf("%d Decide calls to live replicas ran out of their %v deadline", rep.TimedOutLive, rep.DecideTimeout))
	}
	rep.DigestsEqual = len(rep.Final) == len(c.env.replicas)
	for _, f := range rep.Final {
		switch {
		case f.Error != "":
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s did not reach etcd's revision %d: %s", f.Name, rep.Etcd.Revision, f.Error))
			rep.DigestsEqual = false
		case !f.DigestEqual:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s digest %s at revision %d, etcd %s at %d", f.Name, f.Digest, f.Revision,
				rep.Etcd.Digest, rep.Etcd.Revision))
			rep.DigestsEqual = false
		}
		if f.Unseen > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s never answered at the revision of %d acknowledged writes", f.Name, f.Unseen))
		}
		if len(f.ProbeErrors) > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s decides %d acknowledged writes wrongly, e.g. %s", f.Name,
				len(f.ProbeErrors), f.ProbeErrors[0]))
		}
	}
	if n := len(rep.Writes.Lost); n > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d acknowledged writes lost, e.g. %s", n, rep.Writes.Lost[0]))
	}
	for _, s := range rep.Steps {
		if s.Error != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("step %s: %s", s.Fault, s.Error))
		}
	}
	rep.Pass = len(rep.Problems) == 0 && len(rep.Misses) == 0
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return d.Round(10 * time.Millisecond).String()
}

// WriteText prints the report for people.
func (rep *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "verdict-chaos: %s\n", rep.Topology)
	fmt.Fprintf(w, "  Decide %.0f/s to each replica, %v deadline each; policy writes %.0f/s; run %v\n\n",
		rep.DecideRate, rep.DecideTimeout, rep.WriteRate, rep.Duration.Round(100*time.Millisecond))
	fmt.Fprintf(w, "schedule (stale: the longest a replica served without a write acknowledged during the step; flag: Status.stale=true)\n")
	for _, s := range rep.Steps {
		line := fmt.Sprintf("  %8s  %-26s %-24s", fmtOffset(s.Start), s.Fault, s.Target)
		if s.Healed > 0 {
			line += fmt.Sprintf(" healed %s", fmtOffset(s.Healed))
		}
		if s.Note != "" {
			line += "  " + s.Note
		}
		if s.Error != "" {
			line += "  ERROR " + s.Error
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
		var parts []string
		for _, r := range rep.Replicas {
			parts = append(parts, fmt.Sprintf("%s stale %s (flag %s)", r.Name, ms(s.StaleServed[r.Name]), ms(s.StaleFlag[r.Name])))
		}
		fmt.Fprintf(w, "  %8s  %s\n", "", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "\nDecide calls\n")
	row := func(name string, f func(r ReplicaReport) string) {
		fmt.Fprintf(w, "  %-30s", name)
		for _, r := range rep.Replicas {
			fmt.Fprintf(w, " %12s", f(r))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  %-30s", "")
	for _, r := range rep.Replicas {
		fmt.Fprintf(w, " %12s", r.Name)
	}
	fmt.Fprintln(w)
	row("sent", func(r ReplicaReport) string { return fmt.Sprint(r.Sent) })
	row("answered (live)", func(r ReplicaReport) string { return fmt.Sprint(r.OK) })
	row("FAILED, sent to a live replica", func(r ReplicaReport) string { return fmt.Sprint(r.FailedLive) })
	row("cut by a kill -9 in flight", func(r ReplicaReport) string { return fmt.Sprint(r.KilledInFlight) })
	row("sent while down/restarting", func(r ReplicaReport) string { return fmt.Sprint(r.SentWhileDown) })
	row("latency p50 (live)", func(r ReplicaReport) string { return ms(r.Latency.P50) })
	row("latency p99 (live)", func(r ReplicaReport) string { return ms(r.Latency.P99) })
	row("latency max (live)", func(r ReplicaReport) string { return ms(r.Latency.Max) })
	row("starts (1 + restarts)", func(r ReplicaReport) string { return fmt.Sprint(r.Starts) })
	fmt.Fprintf(w, "\nstaleness: per acknowledged write, time served without it\n")
	row("p50", func(r ReplicaReport) string { return ms(r.StaleServed.P50) })
	row("p99", func(r ReplicaReport) string { return ms(r.StaleServed.P99) })
	row("max", func(r ReplicaReport) string { return ms(r.WorstStaleServed.Duration) })
	row("longest Status.stale=true", func(r ReplicaReport) string { return ms(r.LongestStaleFlag.Duration) })
	row("revision regressions", func(r ReplicaReport) string { return fmt.Sprint(r.RevisionRegressed) })
	row("health checks: not SERVING", func(r ReplicaReport) string { return fmt.Sprintf("%d of %d", r.HealthNotServing, r.HealthChecks) })
	for _, r := range rep.Replicas {
		if r.WorstStaleServed.Duration > 0 {
			fmt.Fprintf(w, "  %s worst: during %q (write at revision %d); stale flag longest during %q\n", r.Name,
				r.WorstStaleServed.Phase, r.WorstStaleServed.Revision, r.LongestStaleFlag.Phase)
		}
	}
	ws := rep.Writes
	fmt.Fprintf(w, "\nwrites: %d attempted, %d acknowledged, %d without acknowledgment (%d retries; errors %s), %d deletes; lost %d; %d checked by Decide on every replica\n",
		ws.Attempted, ws.Acked, ws.Failed, ws.Retried, fmtCodes(ws.Errors), ws.Deletes, len(ws.Lost), ws.Probed)
	fmt.Fprintf(w, "\nfinal check: etcd revision %d, %d keys, digest %s (%d compactions during the run)\n",
		rep.Etcd.Revision, rep.Etcd.Keys, rep.Etcd.Digest, rep.Etcd.Compactions)
	for _, f := range rep.Final {
		if f.Error != "" {
			fmt.Fprintf(w, "  %s: ERROR %s\n", f.Name, f.Error)
			continue
		}
		eq := "EQUAL"
		if !f.DigestEqual {
			eq = "DIFFERENT"
		}
		fmt.Fprintf(w, "  %s: revision %d digest %s %s (caught up in %v; %d invalid listed; unseen writes %d; probe errors %d)\n",
			f.Name, f.Revision, f.Digest, eq, f.CaughtUpIn, f.Invalid, f.Unseen, len(f.ProbeErrors))
	}
	fmt.Fprintf(w, "\nfigures\n")
	fmt.Fprintf(w, "  failed Decide calls (>= %v deadline) to live replicas: %d (target 0)\n", rep.DecideTimeout, rep.FailedLive)
	fmt.Fprintf(w, "  longest period a replica served a stale snapshot:   %s (%s)\n", ms(rep.LongestStaleServed.Duration), rep.LongestStaleServed.Phase)
	fmt.Fprintf(w, "  longest continuous Status.stale=true:               %s (%s)\n", ms(rep.LongestStaleFlag.Duration), rep.LongestStaleFlag.Phase)
	fmt.Fprintf(w, "  every replica's digest equals etcd's:               %v (target: always)\n", rep.DigestsEqual)
	for _, r := range rep.Replicas {
		for _, f := range r.Failures {
			fmt.Fprintf(w, "  failure: %s at %s during %q: %s %s\n", f.Replica, fmtOffset(f.At), f.Phase, f.Code, f.Message)
		}
	}
	writeVerdict(w, rep.Pass, rep.Problems, rep.Misses)
}

func fmtOffset(d time.Duration) string {
	return fmt.Sprintf("%d:%04.1f", int(d.Minutes()), d.Seconds()-60*float64(int(d.Minutes())))
}

func fmtCodes(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// writeVerdict ends a report: PASS, or FAIL with the problems and the missed
// targets.
func writeVerdict(w io.Writer, pass bool, problems, misses []string) {
	if pass {
		fmt.Fprintf(w, "\nPASS\n")
		return
	}
	fmt.Fprintf(w, "\nFAIL\n")
	for _, p := range problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
	for _, p := range misses {
		fmt.Fprintf(w, "  - missed: %s\n", p)
	}
}

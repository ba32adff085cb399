// Package decisionlog turns decisions into structured records and exports
// them without ever blocking the decision: a record is offered to a bounded
// queue and dropped (and counted, per mesh) when the queue is full, as OPA's
// decision-log plugin does. One goroutine takes records off the queue in
// batches and writes them to the sinks (JSON lines, OTLP logs) and to the
// followers (live streams of verdictctl logs), each follower with a bounded
// buffer of its own: a follower that falls behind is dropped, never waited
// for.
//
// Nothing a client sends can make the log grow without bound (docs/logs.md):
// a record is cut to a size cap, identical decisions repeated within a
// window are counted into one record (repeats), the records dropped are
// summarised in a record of their own, and the file sink rotates within a
// total size.
//
// A record is the API's verdict.v1.DecisionRecord: the JSON lines are its
// proto3 JSON mapping, the message Follow streams. It imports neither the
// server nor the engine.
package decisionlog

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Record is one decision as logged (docs/logs.md). A record handed to Log
// belongs to the logger and is shared with the sinks and followers: no one
// modifies it afterwards.
type Record = verdictv1.DecisionRecord

// Sink receives batches of records in order. Write may block (a file, the
// network); it is called by the logger's one goroutine only. Records are
// shared: a sink must not modify them.
type Sink interface {
	Write(ctx context.Context, batch []*Record) error
	// Close flushes and releases the sink; no Write follows.
	Close(ctx context.Context) error
}

// Filter chooses which decisions become records.
type Filter int

const (
	// All decisions.
	All Filter = iota
	// Denies: decisions whose final action is DENY.
	Denies
	// AuditDiffs: decisions whose shadow (audit) result differs.
	AuditDiffs
)

// ParseFilter reads all, denies or audit.
func ParseFilter(s string) (Filter, error) {
	switch s {
	case "", "all":
		return All, nil
	case "denies":
		return Denies, nil
	case "audit":
		return AuditDiffs, nil
	}
	return 0, errors.New("decision-log filter: all, denies or audit")
}

// FilterHeader is the gRPC header a Follow stream opens with: the daemon's
// filter (String's words), so that a follower can say why it sees nothing
// (verdictctl logs --audit-only against a daemon that logs denies only).
const FilterHeader = "verdict-decision-log-filter"

func (f Filter) String() string {
	return [...]string{"all", "denies", "audit"}[f]
}

// Defaults of Config.
const (
	DefaultQueueSize       = 10_000
	DefaultBatchSize       = 512
	DefaultFlushInterval   = time.Second
	DefaultMaxRecordBytes  = 4 << 10
	MinMaxRecordBytes      = 1 << 10
	DefaultRepeatWindow    = 5 * time.Second
	DefaultRepeatFlows     = 16_384
	DefaultSummaryInterval = 10 * time.Second
)

// Config of a Logger. Zero values take the defaults.
type Config struct {
	Filter Filter
	// SampleRate: the share of the records the filter keeps that are logged,
	// in (0, 1] (default 1: every one).
	SampleRate float64
	// QueueSize bounds the records waiting to be written (default 10,000);
	// BatchSize the records written in one go (default 512); FlushInterval
	// how long a partial batch may wait (default 1 s).
	QueueSize, BatchSize int
	FlushInterval        time.Duration
	// MaxRecordBytes caps one record's JSON line (default 4 KiB, at least
	// 1 KiB): longer tag keys, values and endpoint names are cut, then tags
	// left out, and the record is marked truncated.
	MaxRecordBytes int
	// RepeatWindow: a decision identical to one logged less than one to two
	// windows before (same flow, caller, RPC, revision and answer) is
	// counted, not logged; each window that counted some writes one record
	// with repeats set (default 5 s; negative: every decision is logged).
	// RepeatFlows bounds the flows tracked at once (default 16,384); a flow
	// beyond it is logged in full.
	RepeatWindow time.Duration
	RepeatFlows  int
	// SummaryInterval: how often a summary record of the records dropped
	// since the last one is written, when any were (default 10 s).
	SummaryInterval time.Duration
	Sinks           []Sink
	Logger          *slog.Logger
}

// Stats are the logger's counters. Every record offered is written,
// dropped or waiting in the queue; Written counts those, not the repeats
// and summary records the logger writes of its own.
type Stats struct {
	Offered, Written, Dropped, SinkErrors, FollowersDropped int64
	// Repeats: decisions counted into a repeats record instead of logged
	// one by one; Truncated: records cut to the size cap.
	Repeats, Truncated int64
	QueueDepth         int
}

// Logger is the decision log. Its methods are safe for concurrent use; Log
// and Repeat never block.
type Logger struct {
	cfg     Config
	queue   chan *Record
	repeats *repeatTable // nil: off
	drops   dropCounts

	offered, written, sinkErrs, followersDropped, truncated atomic.Int64

	mu        sync.Mutex
	followers map[*Follower]struct{}
	closed    bool
}

// New returns a logger; Run writes its records until its context ends.
func New(cfg Config) (*Logger, error) {
	if cfg.SampleRate < 0 || cfg.SampleRate > 1 {
		return nil, errors.New("decision-log sample rate: in (0, 1]")
	}
	if cfg.MaxRecordBytes != 0 && cfg.MaxRecordBytes < MinMaxRecordBytes {
		return nil, errors.New("decision-log record cap: at least 1 KiB")
	}
	if cfg.SampleRate == 0 {
		cfg.SampleRate = 1
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.RepeatWindow == 0 {
		cfg.RepeatWindow = DefaultRepeatWindow
	}
	if cfg.RepeatFlows <= 0 {
		cfg.RepeatFlows = DefaultRepeatFlows
	}
	if cfg.SummaryInterval <= 0 {
		cfg.SummaryInterval = DefaultSummaryInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Logger{cfg: cfg, queue: make(chan *Record, cfg.QueueSize), followers: map[*Follower]struct{}{}}
	if cfg.RepeatWindow > 0 {
		l.repeats = newRepeatTable(cfg.RepeatFlows)
	}
	l.drops.init()
	return l, nil
}

// Wants reports whether a decision with this final action and audit
// difference would be logged (sampling aside): callers build a Record only
// then. A nil logger wants nothing.
func (l *Logger) Wants(deny, auditDiff bool) bool {
	if l == nil {
		return false
	}
	switch l.cfg.Filter {
	case Denies:
		if !deny {
			return false
		}
	case AuditDiffs:
		if !auditDiff {
			return false
		}
	}
	return l.cfg.SampleRate >= 1 || rand.Float64() < l.cfg.SampleRate
}

// Filter is the logger's filter: which decisions become records at all.
func (l *Logger) Filter() Filter { return l.cfg.Filter }

// CountsRepeats reports whether the repeat window is on: only then does a
// caller need a decision's key (Repeat).
func (l *Logger) CountsRepeats() bool { return l.repeats != nil }

// Repeat reports whether a decision whose key is key repeats one logged
// within the repeat window; it is then counted into the flow's next repeats
// record, and the caller builds and logs nothing. Otherwise the caller builds
// the record and hands it to Log with the same key. The key is a hash of
// everything that makes two records the same decision (flow, caller, RPC,
// revision, answer), computed by the caller; 0 (or the repeats off) never
// repeats.
func (l *Logger) Repeat(key uint64) bool {
	if key == 0 || l.repeats == nil {
		return false
	}
	return l.repeats.seen(key)
}

// Log cuts r to the record size cap and offers it to the queue; when the
// queue is full r is dropped and counted under its mesh. It never blocks.
// key is the one Repeat was asked about (0: none). The logger owns r
// afterwards.
func (l *Logger) Log(key uint64, r *Record) {
	l.offered.Add(1)
	if bound(r, l.cfg.MaxRecordBytes) {
		l.truncated.Add(1)
	}
	select {
	case l.queue <- r:
	default:
		l.drops.add(r.GetMesh(), ReasonQueueFull)
	}
	// Kept once queued: a repeats record follows the record it repeats.
	if key != 0 && l.repeats != nil {
		l.repeats.keep(key, r)
	}
}

// Stats returns the counters.
func (l *Logger) Stats() Stats {
	st := Stats{Offered: l.offered.Load(), Written: l.written.Load(), Dropped: l.drops.total(),
		SinkErrors: l.sinkErrs.Load(), FollowersDropped: l.followersDropped.Load(), Truncated: l.truncated.Load(),
		QueueDepth: len(l.queue)}
	if l.repeats != nil {
		st.Repeats = l.repeats.counted.Load()
	}
	return st
}

// Drops calls f with the records dropped so far, per mesh (the first
// MaxDropMeshes meshes that dropped any by name, the others as "other") and
// reason.
func (l *Logger) Drops(f func(mesh, reason string, n int64)) { l.drops.each(f) }

// Run writes batches until ctx ends, then writes what is queued (within
// 5 s), closes the sinks and ends the followers. It also closes the repeat
// windows (writing the repeats records) and writes the summary records of
// what was dropped.
func (l *Logger) Run(ctx context.Context) error {
	batch := make([]*Record, 0, l.cfg.BatchSize)
	tick := time.NewTicker(l.cfg.FlushInterval)
	defer tick.Stop()
	summary := time.NewTicker(l.cfg.SummaryInterval)
	defer summary.Stop()
	var window <-chan time.Time
	if l.repeats != nil {
		t := time.NewTicker(l.cfg.RepeatWindow)
		defer t.Stop()
		window = t.C
	}
	reported := map[dropKey]int64{} // the drops the summaries have told
	flush := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		l.write(ctx, batch)
		clear(batch)
		batch = batch[:0]
	}
	add := func(ctx context.Context, r *Record) {
		batch = append(batch, r)
		if len(batch) == cap(batch) {
			flush(ctx)
		}
	}
	for {
		select {
		case r := <-l.queue:
			add(ctx, r)
		case <-tick.C:
			flush(ctx)
		case <-window:
			// The records queued first, then the repeats of those kept
			// (Log queues before it keeps), written now, not at the tick.
		queued:
			for {
				select {
				case r := <-l.queue:
					add(ctx, r)
				default:
					break queued
				}
			}
			l.repeats.sweep(time.Now(), func(r *Record) { add(ctx, r) })
		case <-summary.C:
			if r := l.drops.summary(time.Now(), reported); r != nil {
				add(ctx, r)
			}
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
		drain:
			for {
				select {
				case r := <-l.queue:
					add(dctx, r)
				default:
					break drain
				}
			}
			if l.repeats != nil {
				l.repeats.sweep(time.Now(), func(r *Record) { add(dctx, r) })
			}
			if r := l.drops.summary(time.Now(), reported); r != nil {
				add(dctx, r)
			}
			flush(dctx)
			var errs []error
			for _, s := range l.cfg.Sinks {
				errs = append(errs, s.Close(dctx))
			}
			l.mu.Lock()
			l.closed = true
			for f := range l.followers {
				f.end(ErrStopped)
			}
			clear(l.followers)
			l.mu.Unlock()
			return errors.Join(errs...)
		}
	}
}

func (l *Logger) write(ctx context.Context, batch []*Record) {
	for _, s := range l.cfg.Sinks {
		if err := s.Write(ctx, batch); err != nil {
			if l.sinkErrs.Add(1)%100 == 1 {
				l.cfg.Logger.Warn("decision log: a sink failed (records of this batch are lost to it)", "err", err,
					"records", len(batch), "failures", l.sinkErrs.Load())
			}
		}
	}
	n := 0
	for _, r := range batch {
		if r.Repeats == 0 && r.Dropped == nil {
			n++
		}
	}
	l.written.Add(int64(n))
	l.mu.Lock()
	for f := range l.followers {
		if !f.offer(batch) {
			delete(l.followers, f)
			l.followersDropped.Add(1)
		}
	}
	l.mu.Unlock()
}

// withRepeats is a record standing for n more decisions identical to r's,
// at t: r's parts are shared (records are not modified once logged).
func withRepeats(r *Record, n int64, t time.Time) *Record {
	return &Record{Time: timestamppb.New(t), Rpc: r.Rpc, Revision: r.Revision, Mesh: r.Mesh, Type: r.Type,
		Source: r.Source, Destination: r.Destination, Protocol: r.Protocol, Port: r.Port, Action: r.Action,
		Policy: r.Policy, Outbound: r.Outbound, Inbound: r.Inbound, Audit: r.Audit, Caller: r.Caller,
		Repeats: n, Truncated: r.Truncated}
}

// Errors that end a follower.
var (
	// ErrTooSlow: the follower's buffer filled up; it was dropped.
	ErrTooSlow = errors.New("decision log: the follower fell behind and was dropped")
	// ErrStopped: the logger stopped.
	ErrStopped = errors.New("decision log: stopped")
)

// Match says which records a follower wants.
type Match func(*Record) bool

// Follower receives the records written after it started that match its
// filter, through a buffer of its own.
type Follower struct {
	match Match
	ch    chan *Record
	once  sync.Once
	err   error
	done  chan struct{}
}

// Follow starts a follower with a buffer of size records (at least 1).
// Close it when done.
func (l *Logger) Follow(match Match, size int) *Follower {
	f := &Follower{match: match, ch: make(chan *Record, max(size, 1)), done: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		f.end(ErrStopped)
		return f
	}
	l.followers[f] = struct{}{}
	return f
}

// Records delivers the follower's records; Done is closed when it ends, and
// Err says why.
func (f *Follower) Records() <-chan *Record { return f.ch }

// Done is closed when the follower has ended (dropped, stopped or closed).
func (f *Follower) Done() <-chan struct{} { return f.done }

// Err says why the follower ended (nil while it runs, or after Close).
func (f *Follower) Err() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// offer gives the follower its matching records of batch without waiting;
// false if its buffer is full (the follower is then ended).
func (f *Follower) offer(batch []*Record) bool {
	for _, r := range batch {
		if f.match != nil && !f.match(r) {
			continue
		}
		select {
		case f.ch <- r:
		default:
			f.end(ErrTooSlow)
			return false
		}
	}
	return true
}

func (f *Follower) end(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.done)
	})
}

// Close stops the follower.
func (l *Logger) Close(f *Follower) {
	l.mu.Lock()
	delete(l.followers, f)
	l.mu.Unlock()
	f.end(nil)
}

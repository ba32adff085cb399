// Package decisionlog turns decisions into structured records and exports
// them without ever blocking the decision: a record is offered to a bounded
// queue and dropped (and counted) when the queue is full, as OPA's
// decision-log plugin does. One goroutine takes records off the queue in
// batches and writes them to the sinks (JSON lines, OTLP logs) and to the
// followers (live streams of verdictctl logs), each follower with a bounded
// buffer of its own: a follower that falls behind is dropped, never waited
// for.
package decisionlog

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Record is one decision as logged. Field names are the JSON names of the
// JSON-lines sink and the attribute names of the OTLP sink (docs/logs.md).
type Record struct {
	Time        time.Time `json:"time"`
	RPC         string    `json:"rpc"` // Decide, DecideBatch, DecideStream, Check
	Revision    int64     `json:"revision"`
	Mesh        string    `json:"mesh"`
	Type        string    `json:"type"`
	Source      Endpoint  `json:"source"`
	Destination Endpoint  `json:"destination"`
	Protocol    string    `json:"protocol,omitempty"`
	Port        uint32    `json:"port,omitempty"`
	Action      string    `json:"action"` // ALLOW or DENY: the enforced final action
	Policy      string    `json:"policy,omitempty"`
	Outbound    Side      `json:"outbound"`
	Inbound     Side      `json:"inbound"`
	Audit       *Audit    `json:"audit,omitempty"` // the shadow result, when it differs
	Caller      Caller    `json:"caller"`
	LatencyNs   int64     `json:"latencyNs"`
}

// Endpoint is one end of the flow as the request gave it, with the tags it
// was decided on.
type Endpoint struct {
	Tags      map[string]string `json:"tags,omitempty"`
	Workload  string            `json:"workload,omitempty"`
	Address   string            `json:"address,omitempty"`
	Principal string            `json:"principal,omitempty"`
	Identity  uint64            `json:"identity,omitempty"`
}

// Side is one side's answer.
type Side struct {
	Action string `json:"action"`
	Policy string `json:"policy,omitempty"`
	Scope  string `json:"scope,omitempty"`
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason"`
}

// Audit is the shadow decision that differs from the enforced one.
type Audit struct {
	Action string `json:"action"`
	Policy string `json:"policy,omitempty"`
	Scope  string `json:"scope,omitempty"`
	Rule   string `json:"rule,omitempty"`
	Side   string `json:"side"`
}

// Caller is who asked: its peer address and, over mTLS, its identity.
type Caller struct {
	Address  string `json:"address,omitempty"`
	Identity string `json:"identity,omitempty"`
}

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
	Sinks                []Sink
	Logger               *slog.Logger
}

// Stats are the logger's counters.
type Stats struct {
	Offered, Written, Dropped, SinkErrors, FollowersDropped int64
	QueueDepth                                              int
}

// Logger is the decision log. Its methods are safe for concurrent use; Log
// never blocks.
type Logger struct {
	cfg   Config
	queue chan *Record

	offered, written, dropped, sinkErrs, followersDropped atomic.Int64

	mu        sync.Mutex
	followers map[*Follower]struct{}
	closed    bool
}

// New returns a logger; Run writes its records until its context ends.
func New(cfg Config) (*Logger, error) {
	if cfg.SampleRate < 0 || cfg.SampleRate > 1 {
		return nil, errors.New("decision-log sample rate: in (0, 1]")
	}
	if cfg.SampleRate == 0 {
		cfg.SampleRate = 1
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 10_000
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 512
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Logger{cfg: cfg, queue: make(chan *Record, cfg.QueueSize), followers: map[*Follower]struct{}{}}, nil
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

// Log offers r to the queue; when the queue is full r is dropped and
// counted. It never blocks. The logger owns r afterwards.
func (l *Logger) Log(r *Record) {
	l.offered.Add(1)
	select {
	case l.queue <- r:
	default:
		l.dropped.Add(1)
	}
}

// Stats returns the counters.
func (l *Logger) Stats() Stats {
	return Stats{Offered: l.offered.Load(), Written: l.written.Load(), Dropped: l.dropped.Load(),
		SinkErrors: l.sinkErrs.Load(), FollowersDropped: l.followersDropped.Load(), QueueDepth: len(l.queue)}
}

// Run writes batches until ctx ends, then writes what is queued (within
// 5 s), closes the sinks and ends the followers.
func (l *Logger) Run(ctx context.Context) error {
	batch := make([]*Record, 0, l.cfg.BatchSize)
	tick := time.NewTicker(l.cfg.FlushInterval)
	defer tick.Stop()
	flush := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		l.write(ctx, batch)
		clear(batch)
		batch = batch[:0]
	}
	for {
		select {
		case r := <-l.queue:
			batch = append(batch, r)
			if len(batch) == cap(batch) {
				flush(ctx)
			}
		case <-tick.C:
			flush(ctx)
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
		drain:
			for {
				select {
				case r := <-l.queue:
					batch = append(batch, r)
					if len(batch) == cap(batch) {
						flush(dctx)
					}
				default:
					break drain
				}
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
	l.written.Add(int64(len(batch)))
	l.mu.Lock()
	for f := range l.followers {
		if !f.offer(batch) {
			delete(l.followers, f)
			l.followersDropped.Add(1)
		}
	}
	l.mu.Unlock()
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

package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// Lazy is a Store that lets a daemon serve before etcd answers: it connects in
// the background, retrying, and until then refuses reads and writes with
// store.ErrUnavailable while its watches wait. Health stays NOT_SERVING until
// the syncer's first full sync, which needs etcd; decisions come from the
// (empty) snapshot meanwhile.
type Lazy struct {
	ready chan struct{} // closed once s is set
	s     *Store

	mu      sync.Mutex
	lastErr error
	closed  bool
}

var _ store.Store = (*Lazy)(nil)

// Connect starts connecting to etcd with cfg in the background, retrying with
// backoff until ctx ends or the store is closed; it returns at once. Progress
// is logged to cfg.Logger.
func Connect(ctx context.Context, cfg Config) *Lazy {
	l := &Lazy{ready: make(chan struct{}), lastErr: errors.New("connecting")}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	go l.connect(ctx, cfg, log)
	return l
}

func (l *Lazy) connect(ctx context.Context, cfg Config, log *slog.Logger) {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		s, err := New(ctx, cfg)
		if err == nil {
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				_ = s.Close() // the daemon stopped while connecting: nothing to report to
				return
			}
			l.s = s
			l.mu.Unlock()
			close(l.ready)
			log.Info("connected to etcd", "endpoints", cfg.Endpoints, "prefix", cfg.Prefix)
			return
		}
		l.mu.Lock()
		l.lastErr = err
		l.mu.Unlock()
		if attempt == 1 || attempt%10 == 0 {
			log.Warn("etcd not reachable yet: retrying (health stays NOT_SERVING until the first sync)", "err", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Ready is closed once the store is connected.
func (l *Lazy) Ready() <-chan struct{} { return l.ready }

// get returns the connected store, or ErrUnavailable.
func (l *Lazy) get() (*Store, error) {
	select {
	case <-l.ready:
		return l.s, nil
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, store.ErrClosed
	}
	return nil, fmt.Errorf("%w: not connected to etcd yet: %v", store.ErrUnavailable, l.lastErr)
}

func (l *Lazy) Apply(ctx context.Context, ops []store.Op) (int64, error) {
	s, err := l.get()
	if err != nil {
		return 0, err
	}
	return s.Apply(ctx, ops)
}

func (l *Lazy) Get(ctx context.Context, key resource.Key) (store.Item, error) {
	s, err := l.get()
	if err != nil {
		return store.Item{}, err
	}
	return s.Get(ctx, key)
}

func (l *Lazy) List(ctx context.Context, opts store.ListOptions) (store.ListPage, error) {
	s, err := l.get()
	if err != nil {
		return store.ListPage{}, err
	}
	return s.List(ctx, opts)
}

// Watch waits for the connection, then forwards the store's watch; the
// channel closes when ctx ends (or the store is closed), as the contract says.
func (l *Lazy) Watch(ctx context.Context, fromRevision int64) <-chan store.Event {
	if s, err := l.get(); err == nil {
		return s.Watch(ctx, fromRevision)
	}
	out := make(chan store.Event)
	go func() {
		defer close(out)
		select {
		case <-ctx.Done():
			return
		case <-l.ready:
		}
		for ev := range l.s.Watch(ctx, fromRevision) {
			select {
			case out <- ev:
			case <-ctx.Done():
			}
		}
	}()
	return out
}

func (l *Lazy) Health() store.Health {
	if s, err := l.get(); err == nil {
		return s.Health()
	} else {
		return store.Health{Err: err}
	}
}

// RequestProgress asks the watch to confirm its revision (see syncer.ProgressRequester).
func (l *Lazy) RequestProgress() {
	if s, err := l.get(); err == nil {
		s.RequestProgress()
	}
}

func (l *Lazy) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	if s, err := l.get(); err == nil {
		return s.Close()
	}
	return nil
}

// Maintain waits for the connection, then runs the store's Maintain (its
// Retention is checked at once).
func (l *Lazy) Maintain(ctx context.Context, r Retention) error {
	if err := r.Validate(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case <-l.ready:
	}
	return l.s.Maintain(ctx, r)
}

// Storage is the connected store's Storage; zero before the connection.
func (l *Lazy) Storage() store.Storage {
	s, err := l.get()
	if err != nil {
		return store.Storage{}
	}
	return s.Storage()
}

var _ store.History = (*Lazy)(nil)

// Revision implements store.History once connected.
func (l *Lazy) Revision(ctx context.Context) (int64, error) {
	s, err := l.get()
	if err != nil {
		return 0, err
	}
	return s.Revision(ctx)
}

// Oldest implements store.History once connected.
func (l *Lazy) Oldest(ctx context.Context) (int64, error) {
	s, err := l.get()
	if err != nil {
		return 0, err
	}
	return s.Oldest(ctx)
}

// StateAt implements store.History once connected.
func (l *Lazy) StateAt(ctx context.Context, rev int64, prefix string) ([]engine.Change, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.StateAt(ctx, rev, prefix)
}

// Versions implements store.History once connected.
func (l *Lazy) Versions(ctx context.Context, key string, prefix bool, from, to int64, limit int) ([]store.Version, bool, error) {
	s, err := l.get()
	if err != nil {
		return nil, false, err
	}
	return s.Versions(ctx, key, prefix, from, to, limit)
}

// Records implements store.History once connected.
func (l *Lazy) Records(ctx context.Context, revisions []int64) (map[int64]store.WriteRecord, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Records(ctx, revisions)
}

// RevisionAt implements store.History once connected.
func (l *Lazy) RevisionAt(ctx context.Context, t time.Time) (int64, error) {
	s, err := l.get()
	if err != nil {
		return 0, err
	}
	return s.RevisionAt(ctx, t)
}

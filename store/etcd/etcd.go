// Package etcd is the store.Store on etcd (docs/storage.md): one key per
// resource under a prefix, written in single transactions with optimistic
// concurrency, listed in pages pinned to one revision, and followed by a watch
// that never loses or repeats an update.
//
// Every call to etcd carries a deadline (Config.RequestTimeout). The watch runs
// as: a paginated list at revision R (sent as a Reset), then a watch from R+1
// under WithRequireLeader with progress notifications, asking for progress every
// ProgressInterval on the watch's own gRPC stream; a watch that says nothing for
// LivenessTimeout (a hard-stopped or partitioned server leaves it silent, with
// no error), that fails, is closed, or is compacted, is dropped and the store
// re-lists, then watches again: Reset, never a gap, never an event twice.
package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/internal/zapslog"
)

// ErrInvalidConfig: New refused its Config.
var ErrInvalidConfig = errors.New("invalid etcd store config")

// Defaults of Config.
const (
	DefaultDialTimeout      = 5 * time.Second
	DefaultRequestTimeout   = 5 * time.Second
	DefaultProgressInterval = 2 * time.Second
	DefaultListPageSize     = 1000
)

// Config configures a Store. Zero values take the documented defaults.
type Config struct {
	// Endpoints of the etcd cluster: URLs ("http://127.0.0.1:2379",
	// "https://etcd-0:2379") or host:port. Required.
	Endpoints []string
	// Prefix of verdict's keys (default store.DefaultPrefix, "/verdict/v1").
	Prefix string
	// DialTimeout bounds New's first contact (default 5s).
	DialTimeout time.Duration
	// RequestTimeout is the deadline of every etcd call the store makes (default
	// 5s); a caller's earlier deadline wins.
	RequestTimeout time.Duration
	// TLS for https endpoints (client certificates included); nil: plaintext.
	TLS *tls.Config
	// Username and Password for etcd's authentication; both or neither.
	Username, Password string
	// Logger receives the store's warnings (broken values, watch restarts) and
	// the etcd client's errors; nil discards them.
	Logger *slog.Logger
	// ProgressInterval: how often a watch asks etcd to confirm its revision
	// (default 2s). Idle watches send a Progress event at this pace.
	ProgressInterval time.Duration
	// LivenessTimeout: a watch that hears nothing for this long (no event, no
	// progress) is presumed dead and replaced by a re-list (default 3 ×
	// ProgressInterval; must exceed ProgressInterval).
	LivenessTimeout time.Duration
	// ListPageSize is the page size of the watch's full lists (default 1000).
	ListPageSize int
	// Now stamps writes (default time.Now).
	Now func() time.Time
}

// Validate checks the config.
func (c Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("%w: at least one endpoint is required", ErrInvalidConfig)
	}
	for _, e := range c.Endpoints {
		if err := checkEndpoint(e); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/")) {
		return fmt.Errorf("%w: prefix %q must start with / and not end with /", ErrInvalidConfig, c.Prefix)
	}
	if strings.HasSuffix(c.Prefix, metaSuffix) {
		return fmt.Errorf("%w: prefix %q ends with %q: that is where another prefix keeps its bookkeeping", ErrInvalidConfig, c.Prefix, metaSuffix)
	}
	for name, d := range map[string]time.Duration{"DialTimeout": c.DialTimeout, "RequestTimeout": c.RequestTimeout,
		"ProgressInterval": c.ProgressInterval, "LivenessTimeout": c.LivenessTimeout} {
		if d < 0 {
			return fmt.Errorf("%w: %s %v is negative", ErrInvalidConfig, name, d)
		}
	}
	if c.LivenessTimeout != 0 && c.LivenessTimeout <= c.withDefaults().ProgressInterval {
		return fmt.Errorf("%w: LivenessTimeout %v must exceed ProgressInterval %v", ErrInvalidConfig, c.LivenessTimeout, c.withDefaults().ProgressInterval)
	}
	if (c.Username == "") != (c.Password == "") {
		return fmt.Errorf("%w: Username and Password go together", ErrInvalidConfig)
	}
	if c.ListPageSize < 0 {
		return fmt.Errorf("%w: ListPageSize %d is negative", ErrInvalidConfig, c.ListPageSize)
	}
	return nil
}

func checkEndpoint(e string) error {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil {
			return fmt.Errorf("endpoint %q: %v", e, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs") || u.Host == "" && u.Path == "" {
			return fmt.Errorf("endpoint %q: want http(s)://host:port or host:port", e)
		}
		return nil
	}
	if e == "" || strings.ContainsAny(e, "/ ") || !strings.Contains(e, ":") {
		return fmt.Errorf("endpoint %q: want http(s)://host:port or host:port", e)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = store.DefaultPrefix
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.LivenessTimeout == 0 {
		c.LivenessTimeout = 3 * c.ProgressInterval
	}
	if c.ListPageSize == 0 {
		c.ListPageSize = DefaultListPageSize
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Store is the etcd store.Store.
type Store struct {
	cfg    Config
	log    *slog.Logger
	cli    *clientv3.Client
	prefix string // cfg.Prefix + "/"
	meta   string // MetaPrefix(cfg.Prefix)

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	skipped atomic.Int64
	watchID atomic.Int64
	reads   atomic.Int64 // Apply's reads before its transaction (tests)

	mu      sync.Mutex
	health  store.Health
	storage store.Storage // Maintain's last round (retention.go)
	record  recordState   // what the write record key was last known to hold (record.go)
	closed  bool
	kicks   map[chan struct{}]struct{} // one per watch: progress requests
}

var _ store.Store = (*Store)(nil)

// New connects to etcd and checks, within DialTimeout (and ctx), that it
// answers: a misconfigured endpoint, certificate or password fails here, with
// store.ErrUnavailable.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zapslog.New(cfg.Logger, "etcd-client", zapcore.ErrorLevel),
		// Reconnect within seconds once etcd is back (gRPC's default backoff
		// grows to two minutes).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: cfg.DialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client: %w", store.ErrUnavailable, err)
	}
	s := &Store{cfg: cfg, log: log, cli: cli, prefix: cfg.Prefix + "/", meta: MetaPrefix(cfg.Prefix), kicks: map[chan struct{}]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	resp, err := cli.Get(cctx, s.prefix, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		s.cancel()
		_ = cli.Close() // the connection is being given up: its close error adds nothing
		return nil, fmt.Errorf("%w: etcd at %v does not answer: %w", store.ErrUnavailable, cfg.Endpoints, err)
	}
	s.health = store.Health{Connected: true, Revision: resp.Header.Revision}
	return s, nil
}

// metaSuffix makes a prefix's meta prefix (MetaPrefix).
const metaSuffix = ".meta"

// MetaPrefix is where the store keeps its bookkeeping for resources under
// prefix (docs/storage.md, "Bookkeeping"): prefix + ".meta/", beside the
// resources' prefix + "/", so that no List, Watch or digest of the resources
// ever sees it, and no mesh name can collide with it. Under it: forms/ (one
// form per type, see Apply), writes (the write records, record.go), clock/
// (revision-time samples) and compactor/ (the election of the replica that
// compacts; see Retention).
func MetaPrefix(prefix string) string {
	if prefix == "" {
		prefix = store.DefaultPrefix
	}
	return prefix + metaSuffix + "/"
}

// Client returns the etcd client the store uses (for tools and tests; writes
// under the prefix must go through Apply).
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix returns the store's key prefix.
func (s *Store) Prefix() string { return s.cfg.Prefix }

// callCtx bounds one etcd call: RequestTimeout, and a tenth of the time the
// caller has left before its own deadline (at least 100 ms of it), so that an
// etcd that does not answer is reported as ErrUnavailable — UNAVAILABLE to an
// API client — before the caller gives up and sees only its own
// DEADLINE_EXCEEDED (issue 12: with etcd down, Apply answered
// DEADLINE_EXCEEDED instead of the documented UNAVAILABLE).
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := s.cfg.RequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if t := left - max(left/10, 100*time.Millisecond); t < timeout {
			timeout = max(t, 0)
		}
	}
	return context.WithTimeout(ctx, timeout)
}

// mapErr turns an etcd error into the store's.
func mapErr(what string, err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %s: %v", store.ErrCompacted, what, err)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("%w: %s: %v", store.ErrInvalidArgument, what, err)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: %s: %v (the write and its checks need more operations than etcd's --max-txn-ops allows: "+
			"split the write, or raise --max-txn-ops to 256 or more; docs/storage.md)", store.ErrTooLarge, what, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("%w: %s: %v", store.ErrTooLarge, what, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, rpctypes.ErrNotLeader):
		return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, what, err)
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code() // no leader, leader changed, timeouts, stopped, unhealthy: Unavailable
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, what, err)
	}
	return fmt.Errorf("etcd %s: %w", what, err)
}

func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

// item decodes a stored key-value, counting and logging a broken value.
// tags, if not nil, interns the tags of workloads (a full list's).
func (s *Store) item(key string, value []byte, create, mod int64, tags *store.TagInterner) store.Item {
	it := store.DecodeItemInterned(strings.TrimPrefix(key, s.prefix), value, create, mod, tags)
	if it.Err != nil {
		s.skipped.Add(1)
		s.log.Warn("skipping a stored value that does not decode", "path", store.RenderPath(it.Path), "mod_revision", mod, "error", it.Err)
	}
	return it
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key resource.Key) (store.Item, error) {
	if err := s.checkOpen(); err != nil {
		return store.Item{}, err
	}
	if key.Kind == 0 {
		return store.Item{}, fmt.Errorf("%w: an empty key", store.ErrInvalidArgument)
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.key(key))
	if err != nil {
		err = mapErr("get "+key.String(), err)
		s.observe(ctx, err, 0)
		return store.Item{}, err
	}
	s.observe(ctx, nil, resp.Header.Revision)
	if len(resp.Kvs) == 0 {
		return store.Item{}, fmt.Errorf("%w: %s", store.ErrNotFound, key.String())
	}
	kv := resp.Kvs[0]
	return s.item(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision, nil), nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, opts store.ListOptions) (store.ListPage, error) {
	if err := s.checkOpen(); err != nil {
		return store.ListPage{}, err
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = store.DefaultPageSize
	}
	rev, start := opts.Revision, s.prefix+opts.Prefix
	if opts.PageToken != "" {
		r, after, err := store.DecodePageToken(opts.Prefix, opts.PageToken)
		if err != nil {
			return store.ListPage{}, err
		}
		rev, start = r, s.prefix+after+"\x00"
	}
	end := clientv3.GetPrefixRangeEnd(s.prefix + opts.Prefix)
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, start, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)), clientv3.WithRev(rev))
	if err != nil {
		err = mapErr("list "+opts.Prefix, err)
		s.observe(ctx, err, 0)
		return store.ListPage{}, err
	}
	s.observe(ctx, nil, resp.Header.Revision)
	if rev == 0 {
		rev = resp.Header.Revision
	}
	page := store.ListPage{Revision: rev, Items: make([]store.Item, len(resp.Kvs))}
	for i, kv := range resp.Kvs {
		page.Items[i] = s.item(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision, nil)
	}
	if resp.More && len(page.Items) > 0 {
		page.NextPageToken = store.EncodePageToken(opts.Prefix, rev, page.Items[len(page.Items)-1].Path)
	}
	return page, nil
}

// Health implements store.Store.
func (s *Store) Health() store.Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.health
	h.Skipped = s.skipped.Load()
	return h
}

// Skipped returns how many stored values failed to decode or validate, each
// time one was read (also in Health; a counter for metrics).
func (s *Store) Skipped() int64 { return s.skipped.Load() }

func (s *Store) seen(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health.Connected, s.health.Err = true, nil
	s.health.Revision = max(s.health.Revision, rev)
}

// observe notes the outcome of a call for Health: a success at rev, or a
// failure to reach etcd that was not the caller giving up.
func (s *Store) observe(ctx context.Context, err error, rev int64) {
	switch {
	case err == nil:
		s.seen(rev)
	case errors.Is(err, store.ErrUnavailable) && ctx.Err() == nil:
		s.lost(err)
	}
}

func (s *Store) lost(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health.Connected, s.health.Err = false, err
}

// RequestProgress asks every watch of the store to have etcd confirm its
// revision now (the syncer calls it when a reader waits for a revision). It
// does not block.
func (s *Store) RequestProgress() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.kicks {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return s.cli.Close()
}

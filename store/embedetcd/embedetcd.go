// Package embedetcd runs etcd inside the process (go.etcd.io/etcd/server/v3/embed):
// the single member `make run` uses when no --etcd-endpoints is given, and the
// members and clusters the store's tests run against (never a mock of etcd).
//
// Members listen on loopback only. Ports left empty are picked free (a listener
// on 127.0.0.1:0, closed, then bound by etcd); a bind conflict in that window is
// retried with new ports. etcd's own logging goes to the configured
// *slog.Logger at error level only (nil: discarded).
//
// etcd registers its metrics on the default Prometheus registry when its
// packages load; verdict does not use that registry and nothing here depends on it.
package embedetcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/internal/listen"
	"github.com/verdictpdp/verdict/store/internal/zapslog"
)

// Errors of this package.
var (
	// ErrInvalidConfig: a Config that cannot start a member.
	ErrInvalidConfig = errors.New("invalid embedded etcd config")
	// ErrStart: the member did not start or did not become ready.
	ErrStart = errors.New("embedded etcd did not start")
	// ErrStopped: an operation that needs a running member.
	ErrStopped = errors.New("embedded etcd is stopped")
)

// MaxTxnOps is the members' --max-txn-ops: room for store.MaxOps writes and
// their checks in one transaction (etcd's default is 128).
const MaxTxnOps = 1024

// Config configures one member.
type Config struct {
	// Dir is the data directory (required). It is created if missing; a member
	// restarted on the same Dir keeps its data.
	Dir string
	// Name of the member (default "default").
	Name string
	// ClientURL and PeerURL, e.g. "http://127.0.0.1:2379". Empty: a free
	// loopback port. Hosts must be loopback addresses.
	ClientURL string
	PeerURL   string
	// HTTPURL serves the member's HTTP endpoints (/health, /metrics,
	// /version: etcd's --listen-client-http-urls), so that ClientURL serves
	// gRPC alone, on grpc-go's own transport. A client URL that serves both
	// hands gRPC to net/http's HTTP/2 server through grpc-go's ServeHTTP
	// adapter (with TLS, always): a goroutine and a flush per message more,
	// on every transaction and watch event. Empty: a free loopback port.
	HTTPURL string
	// Fast uses a 10 ms heartbeat and a 100 ms election timeout (tests); the
	// default is etcd's 100 ms and 1 s.
	Fast bool
	// NoFsync disables fsync (etcd's --unsafe-no-fsync): data may be lost on a
	// crash. For tests only.
	NoFsync bool
	// ProgressNotifyInterval is how often the server sends progress
	// notifications to idle watches that asked for them (default etcd's 10m).
	ProgressNotifyInterval time.Duration
	// Logger receives etcd's errors; nil discards them.
	Logger *slog.Logger
	// Private makes the member no side door (private.go): TLS on both
	// listeners, a client certificate of a CA generated into <Dir>/tls
	// required on each; ClientTLS returns the client's configuration. URLs
	// are https. A single member only. (verdictd's embedded etcd is Private.)
	Private bool

	// InitialCluster is "name=peerURL,..." for a member of a cluster; empty for
	// a single member. Set by StartCluster.
	InitialCluster string
	// ClusterToken distinguishes clusters started from the same URLs.
	ClusterToken string
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Dir == "" {
		return fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	if c.Private && c.InitialCluster != "" {
		return fmt.Errorf("%w: a Private member runs alone (no InitialCluster)", ErrInvalidConfig)
	}
	for _, u := range []string{c.ClientURL, c.PeerURL, c.HTTPURL} {
		if u == "" {
			continue
		}
		if err := checkLoopbackURL(u, c.Private); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.InitialCluster != "" && (c.ClientURL == "" || c.PeerURL == "") {
		return fmt.Errorf("%w: a cluster member needs its ClientURL and PeerURL", ErrInvalidConfig)
	}
	return nil
}

func checkLoopbackURL(s string, private bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("URL %q: %w", s, err)
	}
	switch {
	case private && u.Scheme != "https":
		return fmt.Errorf("URL %q: a Private member's URLs are https", s)
	case !private && u.Scheme != "http":
		return fmt.Errorf("URL %q: only http (loopback) is supported", s)
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() || u.Port() == "" {
		return fmt.Errorf("URL %q: must be a loopback IP with a port", s)
	}
	return nil
}

// Etcd is one running (or stopped) member.
type Etcd struct {
	cfg     Config // URLs resolved
	auto    bool   // ports were picked here (a bind conflict may pick others)
	private *privateCerts
	lock    *os.File // the data directory's lock (lock.go), held until Close

	mu      sync.Mutex
	e       *embed.Etcd
	streams map[int]context.CancelFunc // open client streams, for a hard Stop
	next    int
	// stopping mutes etcd's log while Stop runs: its listeners closing are
	// logged as errors ("use of closed network connection") on every stop.
	stopping atomic.Bool
}

// Start starts a member and waits until it serves clients or ctx ends. The
// member holds its data directory's lock until Close (Stop keeps it):
// another process starting on the directory fails at once with
// ErrDirInUse, and so does one while another etcd holds the database there.
func Start(ctx context.Context, cfg Config) (*Etcd, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "default"
	}
	auto := cfg.ClientURL == "" || cfg.PeerURL == "" || cfg.HTTPURL == ""
	// The directory's lock first: a second process must change nothing in
	// it (the certificates below are rewritten at every start).
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	m, err := start(ctx, cfg, auto, lock)
	if err != nil {
		_ = lock.Close() // releases the flock; nothing was written to it
		return nil, err
	}
	return m, nil
}

// start is Start once the data directory is locked.
func start(ctx context.Context, cfg Config, auto bool, lock *os.File) (*Etcd, error) {
	var private *privateCerts
	if cfg.Private {
		var err error
		if private, err = newPrivateCerts(cfg.Dir); err != nil {
			return nil, fmt.Errorf("%w: certificates: %w", ErrStart, err)
		}
	}
	for attempt := 0; ; attempt++ {
		m := &Etcd{cfg: cfg, auto: auto, private: private, lock: lock}
		if auto {
			ports, err := listen.FreePorts(3)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrStart, err)
			}
			mkURL := LoopbackURL
			if cfg.Private {
				mkURL = func(port int) string { return fmt.Sprintf("https://127.0.0.1:%d", port) }
			}
			if m.cfg.ClientURL == "" {
				m.cfg.ClientURL = mkURL(ports[0])
			}
			if m.cfg.PeerURL == "" {
				m.cfg.PeerURL = mkURL(ports[1])
			}
			if m.cfg.HTTPURL == "" {
				m.cfg.HTTPURL = mkURL(ports[2])
			}
		}
		err := m.start(ctx, true)
		if err == nil {
			return m, nil
		}
		if !auto || !isBindConflict(err) || attempt >= 5 {
			return nil, err
		}
	}
}

// LoopbackURL is http://127.0.0.1:port.
func LoopbackURL(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }

func isBindConflict(err error) bool {
	return strings.Contains(err.Error(), "address already in use")
}

// start launches the member on m.cfg; wait: block until it is ready.
func (m *Etcd) start(ctx context.Context, wait bool) error {
	m.stopping.Store(false)
	ec, err := m.embedConfig()
	if err != nil {
		return err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrStart, m.cfg.Name, err)
	}
	m.mu.Lock()
	m.e = e
	m.mu.Unlock()
	if !wait {
		return nil
	}
	if err := m.waitReady(ctx); err != nil {
		return errors.Join(err, m.Stop())
	}
	return nil
}

func (m *Etcd) waitReady(ctx context.Context) error {
	m.mu.Lock()
	e := m.e
	m.mu.Unlock()
	if e == nil {
		return ErrStopped
	}
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("%w: %s: %v", ErrStart, m.cfg.Name, err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: not ready: %w", ErrStart, m.cfg.Name, ctx.Err())
	}
}

func (m *Etcd) embedConfig() (*embed.Config, error) {
	c := m.cfg
	ec := embed.NewConfig()
	ec.Name = c.Name
	ec.Dir = c.Dir
	cu, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	pu, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	hu, err := url.Parse(c.HTTPURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenClientHttpUrls = []url.URL{*hu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = c.Name + "=" + c.PeerURL
	if c.InitialCluster != "" {
		ec.InitialCluster = c.InitialCluster
	}
	if c.ClusterToken != "" {
		ec.InitialClusterToken = c.ClusterToken
	}
	if c.Fast {
		ec.TickMs, ec.ElectionMs = 10, 100
	}
	ec.UnsafeNoFsync = c.NoFsync
	// verdict's transactions hold up to store.MaxOps writes plus their
	// checks (guards, references, one form per type): more than etcd's
	// default of 128 operations (docs/storage.md, "Transactions").
	ec.MaxTxnOps = MaxTxnOps
	if c.ProgressNotifyInterval > 0 {
		ec.WatchProgressNotifyInterval = c.ProgressNotifyInterval
	}
	if m.private != nil {
		ec.ClientTLSInfo, ec.PeerTLSInfo = m.private.info, m.private.info
	}
	ec.EnableGRPCGateway = false
	ec.Logger = "zap"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapslog.NewMuted(c.Logger, "etcd-server", zapcore.ErrorLevel, &m.stopping))
	ec.GRPCAdditionalServerOptions = []grpc.ServerOption{grpc.ChainStreamInterceptor(m.trackStream)}
	return ec, nil
}

// trackStream lets Stop end the client streams (watches) at once: a graceful
// shutdown would wait for them for etcd's request timeout (over 5 s).
func (m *Etcd) trackStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	m.mu.Lock()
	if m.streams == nil {
		m.streams = map[int]context.CancelFunc{}
	}
	id := m.next
	m.next++
	m.streams[id] = cancel
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.streams, id)
		m.mu.Unlock()
	}()
	err := h(srv, &stream{ServerStream: ss, ctx: ctx})
	if ctx.Err() != nil && ss.Context().Err() == nil {
		// Cut by Stop: tell the client what a crash would, a retriable error.
		return status.Error(codes.Unavailable, "etcd member stopped")
	}
	return err
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// Name returns the member's name.
func (m *Etcd) Name() string { return m.cfg.Name }

// Endpoints returns the client URLs, for clientv3.Config.Endpoints.
func (m *Etcd) Endpoints() []string { return []string{m.cfg.ClientURL} }

// ClientTLS returns the TLS configuration a client of a Private member needs
// (with the client certificate); nil for a member that is not Private.
func (m *Etcd) ClientTLS() *tls.Config {
	if m.private == nil {
		return nil
	}
	return m.private.client.Clone()
}

// HTTPURL returns the URL of the member's HTTP endpoints (/health,
// /metrics, /version); its client URL serves gRPC only.
func (m *Etcd) HTTPURL() string { return m.cfg.HTTPURL }

// PeerURL returns the member's peer URL.
func (m *Etcd) PeerURL() string { return m.cfg.PeerURL }

// Running reports whether the member is started.
func (m *Etcd) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e != nil
}

// IsLeader reports whether the member is running and is its cluster's leader.
func (m *Etcd) IsLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e != nil && m.e.Server.Leader() == m.e.Server.MemberID()
}

// Stop stops the member like a crash seen from its clients: open streams
// (watches) are cut at once, then the server shuts down. The data directory is
// kept; Restart starts the member again on the same URLs. Stopping a stopped
// member does nothing.
func (m *Etcd) Stop() error {
	m.mu.Lock()
	e := m.e
	m.e = nil
	for _, cancel := range m.streams {
		cancel()
	}
	m.mu.Unlock()
	if e == nil {
		return nil
	}
	m.stopping.Store(true)
	e.Server.HardStop() // no leadership transfer: a crash, as the cluster sees it
	e.Close()
	return nil
}

// Restart starts a stopped member again with its data and URLs, and waits
// until it serves clients (for a cluster member: until it has rejoined) or ctx
// ends. A port taken meanwhile is retried for a while.
func (m *Etcd) Restart(ctx context.Context) error {
	if m.Running() {
		return nil
	}
	for {
		err := m.start(ctx, true)
		if err == nil || !isBindConflict(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the member for good and releases its data directory. It is
// safe to call more than once.
func (m *Etcd) Close() error {
	err := m.Stop()
	m.mu.Lock()
	lock := m.lock
	m.lock = nil
	m.mu.Unlock()
	if lock != nil {
		_ = lock.Close() // releases the flock; nothing was written to the file
	}
	return err
}

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	"github.com/verdictpdp/verdict/internal/listen"
)

// Config is the daemon's configuration: flags and their VERDICT_* mirrors
// (main.go), checked by Validate before anything starts.
type Config struct {
	// Listen is the gRPC address (default 127.0.0.1:7070), or "unix:PATH"
	// for a Unix socket (local, like loopback). Beyond loopback it needs
	// authorization (a token or an identity allow-list) and TLS (or
	// InsecureListen).
	Listen string
	// MetricsListen serves Prometheus /metrics over HTTP (default
	// 127.0.0.1:7071; empty disables it). In development mode it must be
	// loopback, as Listen.
	MetricsListen string

	// EtcdEndpoints of an etcd cluster; empty runs an embedded single-member
	// etcd in DataDir.
	EtcdEndpoints []string
	// EtcdPrefix is the key prefix of verdict's resources (default /verdict/v1).
	EtcdPrefix string
	// TLS to etcd: a CA to verify it, and a client certificate and key.
	EtcdCA, EtcdCert, EtcdKey string
	// DataDir holds the embedded etcd's data (default .data/etcd).
	DataDir string
	// Bootstrap is a policy file (YAML, native or Kuma) applied at start when
	// the store holds no resource.
	Bootstrap string
	// Retention is the etcd history kept (default 168h), RetentionRevisions
	// the most revisions kept (default 100000): one replica compacts etcd to
	// the newer of the two bounds (docs/storage.md, "Retention").
	// RetentionOff (--retention off) leaves compaction to whoever runs etcd.
	Retention          time.Duration
	RetentionRevisions int64
	RetentionOff       bool

	// TLS on the gRPC listener: certificate and key, and a CA to verify client
	// certificates (mutual TLS). RequireClientCert refuses clients without
	// one; otherwise they may still call the open RPCs.
	TLSCert, TLSKey, TLSClientCA string
	RequireClientCert            bool
	// AuthTokenFile holds the bearer token that authorizes writes and
	// WatchResources (the file's content, trimmed; never logged).
	AuthTokenFile string
	// AllowIdentities authorize mTLS clients by URI or DNS SAN.
	AllowIdentities []string
	// InsecureListen allows plaintext beyond loopback (behind a TLS proxy, say).
	InsecureListen bool
	// UIListen serves the web explorer (docs/explorer.md) over HTTP on this
	// address; empty (the default) serves none. Its rules are Listen's:
	// beyond loopback it needs authorization and TLS (the listener's
	// certificate), or InsecureListen; with authorization its callers give
	// the token, so it needs AuthTokenFile.
	UIListen string
	// UIHosts are the DNS names the explorer may be reached by, besides IP
	// addresses and localhost; requests naming another host are refused.
	UIHosts []string
	// Advertise is the address the other replicas call this one at for its
	// observed flows (Impact's fleet; docs/analysis.md): registered in etcd
	// under a lease while the daemon runs. Empty: the --listen address,
	// unless it is a wildcard (0.0.0.0, ::), which registers nothing.
	Advertise string
	// AdmitPerCaller bounds the decision calls of one caller executing at
	// once (docs/api.md, "Admission per caller"): 0 takes the default
	// (half of GOMAXPROCS, at least 1), -1 sets no bound.
	AdmitPerCaller int
	// ObservedFlows bounds the table of the distinct flows this replica
	// decided, which Impact replays (default 1,000,000; 0 turns it off).
	ObservedFlows int
	// WatchConditions makes WatchResources carry the policies' standing
	// conditions and the metrics count them (docs/lint.md; on by default:
	// each change costs a judgement of what it can move, off the decision
	// path; --watch-conditions=false turns it off).
	WatchConditions bool
	// DisableExtAuthz stops serving Envoy's envoy.service.auth.v3.Authorization
	// on the gRPC listener (served by default; docs/envoy.md).
	DisableExtAuthz bool

	// LogLevel: debug, info, warn or error (default info). LogFormat: text or json.
	LogLevel  string
	LogFormat string
	// ShutdownTimeout bounds the graceful stop (default 10s).
	ShutdownTimeout time.Duration

	// DecisionLog lists the decision log's sinks: stdout, file:PATH, otlp
	// (empty: off, unless OTEL_LOGS_EXPORTER=otlp). DecisionLogFilter: all,
	// denies or audit; DecisionLogSample: the share kept, in (0, 1];
	// DecisionLogQueue bounds the records waiting (full: dropped, counted).
	DecisionLog       string
	DecisionLogFilter string
	DecisionLogSample float64
	DecisionLogQueue  int
	// DecisionLogMaxSize: a file sink rotates before a file grows past it
	// (default 100 MiB), keeping DecisionLogMaxFiles files in all, the current
	// one included (default 10): at most 1 GiB on disk by default.
	DecisionLogMaxSize  int64
	DecisionLogMaxFiles int
	// DecisionLogMaxRecord caps one record (default 4 KiB): longer tags are
	// cut and the record marked truncated.
	DecisionLogMaxRecord int64
	// DecisionLogRepeatWindow: identical decisions within it are written
	// once, then counted (default 5s; 0: off).
	DecisionLogRepeatWindow time.Duration
}

// Defaults.
const (
	defaultListen        = "127.0.0.1:7070"
	defaultMetricsListen = "127.0.0.1:7071"
	defaultDataDir       = ".data/etcd"
	defaultPrefix        = "/verdict/v1"

	defaultDecisionLogMaxSize  = 100 << 20
	defaultDecisionLogMaxFiles = 10
	minDecisionLogMaxSize      = 64 << 10
	// defaultRetention and defaultRetentionRevisions bound etcd's history.
	defaultRetention          = 168 * time.Hour
	defaultRetentionRevisions = 100000
	// defaultShutdownTimeout bounds the graceful stop.
	defaultShutdownTimeout = 10 * time.Second
)

// Validate checks the configuration; the errors name the flags.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	loopback, err := isLoopback(c.Listen)
	if err != nil {
		add("--listen: %v", err)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			add("--metrics-listen: %v", err)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		add("--tls-cert and --tls-key go together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		add("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
	}
	if c.RequireClientCert && c.TLSClientCA == "" {
		add("--tls-require-client-cert needs --tls-client-ca")
	}
	if len(c.AllowIdentities) > 0 && c.TLSClientCA == "" {
		add("--allow-identity needs --tls-client-ca: identities come from verified client certificates")
	}
	for _, id := range c.AllowIdentities {
		if id == "" {
			add("--allow-identity: an empty identity")
		}
	}
	devMode := c.AuthTokenFile == "" && len(c.AllowIdentities) == 0
	if devMode && c.MetricsListen != "" {
		// The metrics say what the daemon serves (revisions, invalid keys):
		// development mode keeps them on this host too.
		if ml, err := isLoopback(c.MetricsListen); err == nil && !ml {
			add("--metrics-listen %s is beyond loopback: configure authorization first (--auth-token-file or --allow-identity); "+
				"without it the daemon listens on loopback only", c.MetricsListen)
		}
	}
	if err == nil && !loopback {
		if devMode {
			add("--listen %s is beyond loopback: configure authorization first (--auth-token-file or --allow-identity); "+
				"without it the daemon admits every caller and listens on loopback only", c.Listen)
		}
		if c.TLSCert == "" && !c.InsecureListen {
			add("--listen %s is beyond loopback without TLS: set --tls-cert/--tls-key, or --insecure-listen when a proxy terminates TLS", c.Listen)
		}
	}
	c.validateUI(add, devMode)
	if (c.EtcdCert == "") != (c.EtcdKey == "") {
		add("--etcd-cert and --etcd-key go together")
	}
	if len(c.EtcdEndpoints) == 0 && (c.EtcdCA != "" || c.EtcdCert != "") {
		add("--etcd-ca/--etcd-cert are for --etcd-endpoints; the embedded etcd listens on loopback")
	}
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		add("--data-dir is required for the embedded etcd")
	}
	if c.EtcdPrefix == "" || !strings.HasPrefix(c.EtcdPrefix, "/") || strings.HasSuffix(c.EtcdPrefix, "/") {
		add("--etcd-prefix %q: must start with / and not end with one", c.EtcdPrefix)
	}
	for _, f := range []struct{ flag, path string }{{"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey},
		{"--tls-client-ca", c.TLSClientCA}, {"--auth-token-file", c.AuthTokenFile}, {"--bootstrap", c.Bootstrap},
		{"--etcd-ca", c.EtcdCA}, {"--etcd-cert", c.EtcdCert}, {"--etcd-key", c.EtcdKey}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			add("%s: %v", f.flag, err)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		add("--log-level %q: debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		add("--log-format %q: text or json", c.LogFormat)
	}
	if !c.RetentionOff && c.Retention <= 0 {
		add("--retention %v: a positive duration, or off", c.Retention)
	}
	if c.RetentionRevisions <= 0 {
		add("--retention-revisions %d: at least 1", c.RetentionRevisions)
	}
	if c.Advertise != "" && !strings.HasPrefix(c.Advertise, "unix:") {
		if host, port, err := net.SplitHostPort(c.Advertise); err != nil || host == "" || port == "" {
			add("--advertise %q: host:port (or unix:PATH) the other replicas can reach", c.Advertise)
		}
	}
	if c.AdmitPerCaller < -1 {
		add("--admit-per-caller %d: 0 (the default), -1 (no bound) or a number of calls", c.AdmitPerCaller)
	}
	if c.ObservedFlows < 0 {
		add("--observed-flows %d: 0 (off) or more", c.ObservedFlows)
	}
	if c.ShutdownTimeout <= 0 {
		add("--shutdown-timeout must be positive")
	}
	if c.DecisionLogSample <= 0 || c.DecisionLogSample > 1 {
		add("--decision-log-sample: %v: in (0, 1]", c.DecisionLogSample)
	}
	if c.DecisionLogQueue <= 0 {
		add("--decision-log-queue: %d: at least 1", c.DecisionLogQueue)
	}
	if c.DecisionLogMaxRecord < decisionlog.MinMaxRecordBytes {
		add("--decision-log-max-record: %d: at least %s", c.DecisionLogMaxRecord, formatSize(decisionlog.MinMaxRecordBytes))
	}
	if c.DecisionLogMaxSize < max(minDecisionLogMaxSize, c.DecisionLogMaxRecord) {
		add("--decision-log-max-size: %d: at least %s and at least --decision-log-max-record", c.DecisionLogMaxSize,
			formatSize(minDecisionLogMaxSize))
	}
	if c.DecisionLogMaxFiles < 1 {
		add("--decision-log-max-files: %d: at least 1", c.DecisionLogMaxFiles)
	}
	if c.DecisionLogRepeatWindow < 0 {
		add("--decision-log-repeats-window: %v: 0 (off) or more", c.DecisionLogRepeatWindow)
	}
	return errors.Join(errs...)
}

// validateUI checks the explorer's flags: --ui-listen follows --listen's
// rules, and its callers authorize with the token.
func (c *Config) validateUI(add func(string, ...any), devMode bool) {
	if c.UIListen == "" {
		if len(c.UIHosts) > 0 {
			add("--ui-host needs --ui-listen")
		}
		return
	}
	if _, unix := listen.SocketPath(c.UIListen); unix {
		add("--ui-listen %s: a browser reaches host:port, not a Unix socket", c.UIListen)
		return
	}
	loopback, err := isLoopback(c.UIListen)
	if err != nil {
		add("--ui-listen: %v", err)
		return
	}
	if !loopback {
		if devMode {
			add("--ui-listen %s is beyond loopback: configure authorization first (--auth-token-file); "+
				"without it the explorer answers every caller and listens on loopback only", c.UIListen)
		}
		if c.TLSCert == "" && !c.InsecureListen {
			add("--ui-listen %s is beyond loopback without TLS: set --tls-cert/--tls-key, or --insecure-listen when a proxy terminates TLS", c.UIListen)
		}
	}
	if !devMode && c.AuthTokenFile == "" {
		add("--ui-listen with --allow-identity alone: the explorer's callers authorize with the bearer token; set --auth-token-file")
	}
	for _, h := range c.UIHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			add("--ui-host %q: a DNS name without port", h)
		}
	}
}

// isLoopback reports whether a listen address is reachable from this host
// only: loopback, or a Unix socket.
func isLoopback(addr string) (bool, error) {
	if err := listen.Check(addr); err != nil {
		return false, err
	}
	if _, unix := listen.SocketPath(addr); unix {
		return true, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	switch host {
	case "localhost":
		return true, nil
	case "":
		return false, nil // every interface
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false, fmt.Errorf("host %q: use an IP address or localhost", host)
	}
	return ip.IsLoopback(), nil
}

// serverTLS loads the listener's TLS configuration; nil without --tls-cert.
func (c *Config) serverTLS() (*tls.Config, error) {
	if c.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCA != "" {
		pool, err := loadPool(c.TLSClientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if c.RequireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, nil
}

// etcdTLS loads the TLS configuration to etcd; nil when none is set.
func (c *Config) etcdTLS() (*tls.Config, error) {
	if c.EtcdCA == "" && c.EtcdCert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.EtcdCA != "" {
		pool, err := loadPool(c.EtcdCA)
		if err != nil {
			return nil, fmt.Errorf("--etcd-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if c.EtcdCert != "" {
		cert, err := tls.LoadX509KeyPair(c.EtcdCert, c.EtcdKey)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// token reads the bearer token; "" without --auth-token-file.
func (c *Config) token() (string, error) {
	if c.AuthTokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.AuthTokenFile)
	if err != nil {
		return "", fmt.Errorf("--auth-token-file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", errors.New("--auth-token-file: the file is empty")
	}
	return t, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

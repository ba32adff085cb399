package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Config is the agent's configuration (cmd/verdict-agent's flags), checked
// by Validate before anything starts.
type Config struct {
	// Server is verdictd's gRPC address (host:port, or unix:PATH).
	Server string
	// TokenFile holds the bearer token (the file's content, trimmed; never
	// logged). TLSCA verifies the server and turns TLS on; TLSCert and TLSKey
	// are the client certificate for mutual TLS; TLSServerName overrides the
	// name verified. WatchRules with address sets needs an authorized caller:
	// a token or a client certificate on verdictd's allow-list.
	TokenFile              string
	TLSCA, TLSCert, TLSKey string
	TLSServerName          string
	Mesh, Type             string // empty: verdict's defaults (default, TrafficPermission)
	Workloads              []string
	Interfaces             []string
	Table                  string
	Initial                string // drop or accept
	MetricsListen          string // empty: no metrics endpoint
	NetNS                  string // a network namespace file to program; empty: the agent's own
	BackoffMin, BackoffMax time.Duration
	InterfaceRescan        time.Duration
	LogLevel               string
	// NoAuth connects without a token or client certificate: only to a
	// verdictd on loopback in development mode, which authorizes every caller.
	NoAuth bool
}

// Defaults.
const (
	DefaultServer        = "127.0.0.1:7070"
	DefaultTable         = "verdict"
	DefaultMetricsListen = "127.0.0.1:7072"
	DefaultInitial       = InitialDrop
)

// Initial stances: what a guarded workload's traffic meets before its first
// rules arrive (docs/agent.md).
const (
	InitialDrop   = "drop"
	InitialAccept = "accept"
)

// Validate checks the configuration; the errors name the flags.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Server == "" {
		add("--server: verdictd's address is required")
	} else if !strings.HasPrefix(c.Server, "unix:") {
		if _, _, err := net.SplitHostPort(c.Server); err != nil {
			add("--server %q: %v", c.Server, err)
		}
	}
	if len(c.Workloads) == 0 && len(c.Interfaces) == 0 {
		add("name the workloads to guard: --workload NAME (repeatable) or --interfaces IF[,IF...]")
	}
	seen := map[string]bool{}
	for _, w := range c.Workloads {
		if strings.TrimSpace(w) == "" {
			add("--workload: an empty name")
		}
		if seen[w] {
			add("--workload %q given twice", w)
		}
		seen[w] = true
	}
	for _, i := range c.Interfaces {
		if i == "" {
			add("--interfaces: an empty interface name")
		}
	}
	if !nameOK(c.Table) {
		add("--table %q: 1-40 characters [A-Za-z0-9_-]", c.Table)
	}
	switch c.Initial {
	case InitialDrop, InitialAccept:
	default:
		add("--initial %q: drop or accept", c.Initial)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			add("--metrics-listen %q: %v", c.MetricsListen, err)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		add("--tls-cert and --tls-key go together")
	}
	secure := c.TLSCA != "" || c.TLSCert != "" || c.TLSServerName != ""
	if c.TokenFile != "" && !secure && !loopback(c.Server) {
		add("--server %s is beyond loopback: the token is not sent in plaintext; set --tls-ca", c.Server)
	}
	switch {
	case c.NoAuth && (c.TokenFile != "" || c.TLSCert != ""):
		add("--no-auth with --token-file or --tls-cert: choose one")
	case c.NoAuth && !loopback(c.Server):
		add("--no-auth is for a verdictd on loopback in development mode; %s is beyond loopback", c.Server)
	case !c.NoAuth && c.TokenFile == "" && c.TLSCert == "":
		add("authenticate to verdictd: --token-file or --tls-cert/--tls-key (address sets are for authorized callers; --no-auth for a development verdictd on loopback)")
	}
	for _, f := range []struct{ flag, path string }{{"--token-file", c.TokenFile}, {"--tls-ca", c.TLSCA},
		{"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey}, {"--netns", c.NetNS}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			add("%s: %v", f.flag, err)
		}
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		add("--backoff-min %v, --backoff-max %v: positive, min ≤ max", c.BackoffMin, c.BackoffMax)
	}
	if len(c.Interfaces) > 0 && c.InterfaceRescan <= 0 {
		add("--interface-rescan must be positive")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		add("--log-level %q: debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// dialOptions are the credentials for verdictd: TLS when any TLS option is
// given, the bearer token with every call.
func (c *Config) dialOptions() ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	secure := c.TLSCA != "" || c.TLSCert != "" || c.TLSServerName != ""
	if secure {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
		if c.TLSCA != "" {
			b, err := os.ReadFile(c.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", c.TLSCA)
			}
			cfg.RootCAs = pool
		}
		if c.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("--token-file: %s is empty", c.TokenFile)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: token, secure: secure}))
	}
	return opts, nil
}

// bearer sends "authorization: Bearer <token>" with every call.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(_ context.Context, _ ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// loopback reports whether addr stays on this host.
func loopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}

// nameOK: 1-40 characters [A-Za-z0-9_-] (nftables names the firewall accepts).
func nameOK(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

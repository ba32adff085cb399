package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/verdictpdp/verdict/internal/dial"
	"google.golang.org/grpc"
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
	if c.TokenFile != "" && !c.dialConfig().Secure() && !dial.Loopback(c.Server) {
		add("--server %s is beyond loopback: the token is not sent in plaintext; set --tls-ca", c.Server)
	}
	switch {
	case c.NoAuth && (c.TokenFile != "" || c.TLSCert != ""):
		add("--no-auth with --token-file or --tls-cert: choose one")
	case c.NoAuth && !dial.Loopback(c.Server):
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
	o := c.dialConfig()
	if c.TokenFile != "" {
		token, err := dial.ReadToken(c.TokenFile)
		if err != nil {
			return nil, err
		}
		if token == "" {
			return nil, fmt.Errorf("--token-file: %s is empty", c.TokenFile)
		}
		o.Token = token
	}
	return o.DialOptions()
}

func (c *Config) dialConfig() dial.Options {
	return dial.Options{Server: c.Server, CAFile: c.TLSCA, CertFile: c.TLSCert, KeyFile: c.TLSKey, ServerName: c.TLSServerName}
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

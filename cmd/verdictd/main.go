// Command verdictd is verdict's daemon: the gRPC API (docs/api.md) over
// the policies of an etcd cluster, or of an embedded etcd when no endpoints
// are given. Every flag has a VERDICT_* environment mirror (--listen and
// VERDICT_LISTEN); a flag given on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	"github.com/verdictpdp/verdict/internal/observed"
)

func main() {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	bound := make(chan time.Duration, 1)
	go stopOnSignal(sig, cancel, bound, os.Stderr, os.Exit)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stderr, func(d time.Duration) { bound <- d })
	cancel()
	os.Exit(code)
}

// forcedExit is the exit code of a stop that did not end in time.
const forcedExit = 1

// stopMargin is the time a stop may take beyond ShutdownTimeout (the gRPC
// server's graceful stop) for what follows it: the store, the embedded etcd,
// telemetry.
const stopMargin = 5 * time.Second

// stopOnSignal ends the process on SIGINT or SIGTERM, however it is stuck:
// the first signal cancels the daemon's context, which stops it gracefully;
// a second signal, or a stop still running after its bound (ShutdownTimeout
// plus stopMargin, received on bound once the configuration is read), exits
// at once with forcedExit. (Before, a daemon waiting at start for a lock —
// a data directory in use — ignored both.)
func stopOnSignal(sig <-chan os.Signal, cancel context.CancelFunc, bound <-chan time.Duration, stderr io.Writer, exit func(int)) {
	limit := defaultShutdownTimeout + stopMargin
wait:
	for {
		select {
		case d := <-bound:
			limit = d + stopMargin
		case s := <-sig:
			cancel()
			fmt.Fprintf(stderr, "verdictd: %v: stopping (within %v; a second signal stops at once)\n", s, limit)
			break wait
		}
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case s := <-sig:
		fmt.Fprintf(stderr, "verdictd: %v again: exiting now\n", s)
	case <-timer.C:
		fmt.Fprintf(stderr, "verdictd: the stop did not end within %v: exiting now\n", limit)
	}
	exit(forcedExit)
}

// run parses the configuration, validates it and runs the daemon until ctx
// ends; bound receives the configured ShutdownTimeout before the daemon
// starts (stopOnSignal). Exit codes: 0 after a clean stop, 1 when the daemon
// failed (or its stop was forced), 2 for a configuration it refuses.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, bound func(time.Duration)) int {
	cfg, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "verdictd: %v\n", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "verdictd: invalid configuration:\n%v\n", err)
		return 2
	}
	bound(cfg.ShutdownTimeout)
	log := newLogger(cfg, stderr)
	if err := Run(ctx, cfg, log); err != nil {
		log.Error("verdictd failed", "err", err)
		return 1
	}
	return 0
}

// parseFlags reads the flags; each defaults to its VERDICT_* variable, then to
// the documented default.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("verdictd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c Config
	var envErrs []error
	str := func(p *string, name, def, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			def = v
		}
		fs.StringVar(p, name, def, usage+" ("+env+")")
	}
	list := func(p *[]string, name, usage string) {
		env := envName(name)
		*p = splitList(getenv(env))
		given := false
		fs.Func(name, usage+"; comma-separated, repeatable ("+env+")", func(s string) error {
			if !given { // the command line replaces the environment
				*p, given = nil, true
			}
			*p = append(*p, splitList(s)...)
			return nil
		})
	}
	booleanDef := func(p *bool, name string, def bool, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: not a boolean", env, v))
			}
			def = b
		}
		fs.BoolVar(p, name, def, usage+" ("+env+")")
	}
	boolean := func(p *bool, name, usage string) { booleanDef(p, name, false, usage) }
	duration := func(p *time.Duration, name string, def time.Duration, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: not a duration", env, v))
			}
			def = d
		}
		fs.DurationVar(p, name, def, usage+" ("+env+")")
	}
	float := func(p *float64, name string, def float64, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: not a number", env, v))
			}
			def = f
		}
		fs.Float64Var(p, name, def, usage+" ("+env+")")
	}
	integer := func(p *int, name string, def int, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: not an integer", env, v))
			}
			def = n
		}
		fs.IntVar(p, name, def, usage+" ("+env+")")
	}
	int64Flag := func(p *int64, name string, def int64, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: not an integer", env, v))
			}
			def = n
		}
		fs.Int64Var(p, name, def, usage+" ("+env+")")
	}
	str(&c.Listen, "listen", defaultListen, "gRPC listen address: host:port, or unix:PATH for a Unix socket; beyond loopback it needs authorization and TLS")
	str(&c.MetricsListen, "metrics-listen", defaultMetricsListen, "HTTP address of Prometheus /metrics; empty disables it")
	list(&c.EtcdEndpoints, "etcd-endpoints", "etcd client URLs; empty runs an embedded etcd in --data-dir")
	str(&c.EtcdPrefix, "etcd-prefix", defaultPrefix, "etcd key prefix of verdict's resources")
	str(&c.EtcdCA, "etcd-ca", "", "CA certificate (PEM) that verifies etcd")
	str(&c.EtcdCert, "etcd-cert", "", "client certificate (PEM) for etcd")
	str(&c.EtcdKey, "etcd-key", "", "client key (PEM) for etcd")
	str(&c.DataDir, "data-dir", defaultDataDir, "data directory of the embedded etcd")
	str(&c.Bootstrap, "bootstrap", "", "policy file applied at start when the store holds no resource")
	retention := func(name string, def time.Duration, usage string) {
		env := envName(name)
		set := func(v string) error {
			if v == "off" {
				c.Retention, c.RetentionOff = 0, true
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%q: a duration (168h) or off", v)
			}
			c.Retention, c.RetentionOff = d, false
			return nil
		}
		c.Retention = def
		if v := getenv(env); v != "" {
			if err := set(v); err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%w", env, err))
			}
		}
		fs.Func(name, usage+" (default "+def.String()+"; "+env+")", set)
	}
	retention("retention", defaultRetention, "etcd history kept, or off to leave compaction to whoever runs etcd")
	int64Flag(&c.RetentionRevisions, "retention-revisions", defaultRetentionRevisions, "at most this many etcd revisions kept")
	str(&c.TLSCert, "tls-cert", "", "server certificate (PEM) of the gRPC listener")
	str(&c.TLSKey, "tls-key", "", "server key (PEM) of the gRPC listener")
	str(&c.TLSClientCA, "tls-client-ca", "", "CA (PEM) that verifies client certificates (mutual TLS)")
	boolean(&c.RequireClientCert, "tls-require-client-cert", "refuse TLS clients without a verified certificate")
	str(&c.AuthTokenFile, "auth-token-file", "", "file holding the bearer token that authorizes writes and WatchResources")
	list(&c.AllowIdentities, "allow-identity", "mTLS client identity (URI or DNS SAN) authorized for writes and WatchResources")
	boolean(&c.InsecureListen, "insecure-listen", "allow plaintext gRPC beyond loopback (TLS terminated by a proxy)")
	str(&c.UIListen, "ui-listen", "", "HTTP address of the web explorer (docs/explorer.md); empty: off; beyond loopback it needs authorization and TLS")
	list(&c.UIHosts, "ui-host", "DNS name the explorer may be reached by, besides IP addresses and localhost")
	str(&c.Advertise, "advertise", "", "address the other replicas reach this one at, registered in etcd for Impact's fleet (default: --listen unless a wildcard)")
	integer(&c.AdmitPerCaller, "admit-per-caller", 0, "decision calls of one caller (its certificate's identity, else its IP address) executing at once while another caller is present (alone: no bound), the others waiting their turn; 0: half of GOMAXPROCS (at least 1); -1: no bound")
	integer(&c.ObservedFlows, "observed-flows", observed.DefaultMax, "distinct decided flows kept for Impact, the least recently seen evicted; 0: off")
	booleanDef(&c.WatchConditions, "watch-conditions", true, "WatchResources messages carry each policy's standing conditions, verdict_policy_conditions counts them (docs/lint.md); each change costs a judgement of what it can move; =false turns it off")
	boolean(&c.DisableExtAuthz, "disable-ext-authz", "do not serve Envoy's ext_authz API (envoy.service.auth.v3.Authorization) on the gRPC listener")
	str(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	str(&c.LogFormat, "log-format", "text", "text or json")
	duration(&c.ShutdownTimeout, "shutdown-timeout", defaultShutdownTimeout, "bound of the graceful stop")
	size := func(p *int64, name string, def int64, usage string) {
		env := envName(name)
		if v := getenv(env); v != "" {
			n, err := parseSize(v)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
			def = n
		}
		*p = def
		fs.Func(name, fmt.Sprintf("%s (default %s; %s)", usage, formatSize(def), env), func(s string) (err error) {
			*p, err = parseSize(s)
			return err
		})
	}
	str(&c.DecisionLog, "decision-log", "", "decision log sinks, comma-separated: stdout, file:PATH, otlp (OTEL_EXPORTER_OTLP_*); empty: off")
	str(&c.DecisionLogFilter, "decision-log-filter", "all", "which decisions are logged: all, denies or audit (shadow result differs)")
	float(&c.DecisionLogSample, "decision-log-sample", 1, "share of the filtered decisions logged, in (0, 1]")
	integer(&c.DecisionLogQueue, "decision-log-queue", 10000, "decision records waiting to be written; beyond, records are dropped and counted")
	size(&c.DecisionLogMaxSize, "decision-log-max-size", defaultDecisionLogMaxSize,
		"a decision log file:PATH is rotated (PATH.1, PATH.2, ...) before it grows past this size (B, KiB, MiB, GiB)")
	integer(&c.DecisionLogMaxFiles, "decision-log-max-files", defaultDecisionLogMaxFiles,
		"decision log files kept, the current one included: at most max-files x max-size bytes on disk")
	size(&c.DecisionLogMaxRecord, "decision-log-max-record", decisionlog.DefaultMaxRecordBytes,
		"a decision record longer than this is cut (long tags and values first) and marked truncated")
	duration(&c.DecisionLogRepeatWindow, "decision-log-repeats-window", decisionlog.DefaultRepeatWindow,
		"identical decisions within this window are written once, then counted in one record (repeats); 0: every decision is written")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "verdictd — verdict's policy decision daemon\n\nUsage: verdictd [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (verdictd takes flags only)", fs.Arg(0))
	}
	return c, errors.Join(envErrs...)
}

func envName(flagName string) string {
	return "VERDICT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newLogger(c Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// parseSize reads a byte count: a number, optionally followed by B, KiB, MiB
// or GiB (K, M, G and KB, MB, GB mean the same powers of 1024).
func parseSize(s string) (int64, error) {
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.ToLower(strings.TrimSpace(s[len(num):]))
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q: not a size (a number with B, KiB, MiB or GiB)", s)
	}
	shift := map[string]int{"": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20, "g": 30, "gb": 30, "gib": 30}
	sh, ok := shift[unit]
	if !ok || n > math.MaxInt64>>sh {
		return 0, fmt.Errorf("%q: not a size (a number with B, KiB, MiB or GiB)", s)
	}
	return n << sh, nil
}

// formatSize writes n in the largest unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		shift int
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n > 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

package agent

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// ParseFlags reads cmd/verdict-agent's flags into a Config (not validated).
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("verdict-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c Config
	var workloads, interfaces listFlag
	fs.StringVar(&c.Server, "server", DefaultServer, "verdictd's gRPC address (host:port or unix:PATH)")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding the bearer token verdictd authorizes")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "CA (PEM) that verifies verdictd; turns TLS on")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&c.TLSKey, "tls-key", "", "client key (PEM) for mutual TLS")
	fs.StringVar(&c.TLSServerName, "tls-server-name", "", "name to verify in verdictd's certificate (default: the --server host)")
	fs.BoolVar(&c.NoAuth, "no-auth", false, "no token and no client certificate: for a development verdictd on loopback only")
	fs.StringVar(&c.Mesh, "mesh", "", "the mesh (empty: default)")
	fs.StringVar(&c.Type, "type", "", "the policy type (empty: TrafficPermission)")
	fs.Var(&workloads, "workload", "a workload to guard, by name (repeatable, or comma-separated)")
	fs.Var(&interfaces, "interfaces", "guard the addresses of these local interfaces (comma-separated), watched by address")
	fs.StringVar(&c.Table, "table", DefaultTable, "the nftables table (family inet) the agent owns and replaces whole")
	fs.StringVar(&c.Initial, "initial", DefaultInitial, "stance of a guarded address before its first rules: drop or accept (docs/agent.md)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", DefaultMetricsListen, "Prometheus /metrics address (empty: off)")
	fs.StringVar(&c.NetNS, "netns", "", "program the firewall of this network namespace (a file such as /run/netns/NAME); default: the agent's own")
	fs.DurationVar(&c.BackoffMin, "backoff-min", 200*time.Millisecond, "first reconnect delay after a stream fails")
	fs.DurationVar(&c.BackoffMax, "backoff-max", 30*time.Second, "longest reconnect delay")
	fs.DurationVar(&c.InterfaceRescan, "interface-rescan", 10*time.Second, "how often --interfaces' addresses are read again")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: verdict-agent --workload NAME [--workload NAME...] | --interfaces IF[,IF] [flags]\n\n"+
			"Follows WatchRules for the guarded workloads and programs them into an nftables table (docs/agent.md).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c.Workloads, c.Interfaces = workloads, interfaces
	return c, nil
}

// listFlag is a repeatable, comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for p := range strings.SplitSeq(s, ",") {
		*l = append(*l, strings.TrimSpace(p))
	}
	return nil
}

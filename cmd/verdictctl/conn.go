package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/verdictpdp/verdict/internal/dial"
	"google.golang.org/grpc"
)

// connFlags are the flags every command that talks to verdictd takes, with
// their VERDICT_* environment mirrors.
type connFlags struct {
	server     string
	tokenFile  string
	caFile     string
	certFile   string
	keyFile    string
	serverName string
	timeout    time.Duration
}

const defaultServer = "127.0.0.1:7070"

func (c *connFlags) register(fs *flagSet, getenv func(string) string) {
	def := func(env, d string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return d
	}
	fs.StringVar(&c.server, "server", def("VERDICT_SERVER", defaultServer), "verdictd's gRPC `ADDR` (VERDICT_SERVER)")
	fs.StringVar(&c.tokenFile, "token-file", def("VERDICT_TOKEN_FILE", ""), "`FILE` holding the bearer token for writes and watch (VERDICT_TOKEN_FILE)")
	fs.StringVar(&c.caFile, "tls-ca", def("VERDICT_TLS_CA", ""), "CA (PEM `FILE`) that verifies the server; turns TLS on (VERDICT_TLS_CA)")
	fs.StringVar(&c.certFile, "tls-cert", def("VERDICT_TLS_CERT", ""), "client certificate (PEM `FILE`) for mutual TLS (VERDICT_TLS_CERT)")
	fs.StringVar(&c.keyFile, "tls-key", def("VERDICT_TLS_KEY", ""), "client key (PEM `FILE`) for mutual TLS (VERDICT_TLS_KEY)")
	fs.StringVar(&c.serverName, "tls-server-name", def("VERDICT_TLS_SERVER_NAME", ""), "`NAME` to verify in the server's certificate (default: the --server host)")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of each call (watch: of connecting)")
	for _, n := range []string{"server", "token-file", "tls-ca", "tls-cert", "tls-key", "tls-server-name", "timeout"} {
		fs.conn[n] = true
	}
}

// dial connects to verdictd. TLS is on when any TLS flag is given; a token
// is sent in plaintext only to a loopback address.
func (c *connFlags) dial() (*grpc.ClientConn, error) {
	token, err := c.token()
	if err != nil {
		return nil, err
	}
	opts, err := dial.Options{Server: c.server, CAFile: c.caFile, CertFile: c.certFile, KeyFile: c.keyFile,
		ServerName: c.serverName, Token: token}.DialOptions()
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(c.server, opts...)
}

func (c *connFlags) token() (string, error) {
	if c.tokenFile == "" {
		return strings.TrimSpace(os.Getenv("VERDICT_TOKEN")), nil
	}
	return dial.ReadToken(c.tokenFile)
}

func (c *connFlags) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, c.timeout)
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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

func (c *connFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	def := func(env, d string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return d
	}
	fs.StringVar(&c.server, "server", def("VERDICT_SERVER", defaultServer), "verdictd's gRPC address (VERDICT_SERVER)")
	fs.StringVar(&c.tokenFile, "token-file", def("VERDICT_TOKEN_FILE", ""), "file holding the bearer token for writes and watch (VERDICT_TOKEN_FILE)")
	fs.StringVar(&c.caFile, "tls-ca", def("VERDICT_TLS_CA", ""), "CA (PEM) that verifies the server; turns TLS on (VERDICT_TLS_CA)")
	fs.StringVar(&c.certFile, "tls-cert", def("VERDICT_TLS_CERT", ""), "client certificate (PEM) for mutual TLS (VERDICT_TLS_CERT)")
	fs.StringVar(&c.keyFile, "tls-key", def("VERDICT_TLS_KEY", ""), "client key (PEM) for mutual TLS (VERDICT_TLS_KEY)")
	fs.StringVar(&c.serverName, "tls-server-name", def("VERDICT_TLS_SERVER_NAME", ""), "name to verify in the server's certificate (default: the --server host)")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of each call (watch: of connecting)")
}

// dial connects to verdictd. TLS is on when any TLS flag is given; a token
// is sent in plaintext only to a loopback address.
func (c *connFlags) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	secure := c.caFile != "" || c.certFile != "" || c.serverName != ""
	if secure {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName}
		if c.caFile != "" {
			b, err := os.ReadFile(c.caFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", c.caFile)
			}
			cfg.RootCAs = pool
		}
		if (c.certFile == "") != (c.keyFile == "") {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		if c.certFile != "" {
			cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	token, err := c.token()
	if err != nil {
		return nil, err
	}
	if token != "" {
		if !secure && !loopback(c.server) {
			return nil, fmt.Errorf("refusing to send the token in plaintext to %s: use TLS (--tls-ca)", c.server)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: token, secure: secure}))
	}
	return grpc.NewClient(c.server, opts...)
}

func (c *connFlags) token() (string, error) {
	if c.tokenFile == "" {
		return strings.TrimSpace(os.Getenv("VERDICT_TOKEN")), nil
	}
	b, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (c *connFlags) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, c.timeout)
}

// loopback reports whether addr stays on this host: a loopback address or a
// Unix socket ("unix:PATH").
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

// bearer sends "authorization: Bearer <token>" with every call.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// newFlags makes a command's flag set; its usage names the command.
func newFlags(name, args, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("verdictctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: verdictctl %s %s\n\n%s\n\nFlags:\n", name, args, about)
		fs.PrintDefaults()
	}
	return fs
}

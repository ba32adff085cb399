// Package dial is the client side of verdictd's credentials, shared by
// verdictctl and verdict-agent: TLS (and mutual TLS) from PEM files, and a
// bearer token sent with every call — never in plaintext beyond loopback.
package dial

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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Options say how to reach verdictd. Error messages name the command-line
// flags both binaries use (--tls-ca, --tls-cert, --tls-key).
type Options struct {
	Server     string // verdictd's address: host:port or unix:PATH
	CAFile     string // CA (PEM) that verifies the server; turns TLS on
	CertFile   string // client certificate (PEM) for mutual TLS
	KeyFile    string // its key
	ServerName string // the name to verify in the server's certificate; turns TLS on
	Token      string // a bearer token ("" = none)
}

// Secure reports whether the connection uses TLS: when any TLS option is set.
func (o Options) Secure() bool { return o.CAFile != "" || o.CertFile != "" || o.ServerName != "" }

// DialOptions are the transport credentials and, with a token, the per-call
// credentials. A token without TLS is refused unless the server is on
// loopback.
func (o Options) DialOptions() ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if o.Secure() {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
		if o.CAFile != "" {
			b, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", o.CAFile)
			}
			cfg.RootCAs = pool
		}
		if (o.CertFile == "") != (o.KeyFile == "") {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		if o.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.Token != "" {
		if !o.Secure() && !Loopback(o.Server) {
			return nil, fmt.Errorf("refusing to send the token in plaintext to %s: use TLS (--tls-ca)", o.Server)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: o.Token, secure: o.Secure()}))
	}
	return opts, nil
}

// ReadToken reads a token file, surrounding white space trimmed.
func ReadToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Loopback reports whether addr stays on this host: a loopback address,
// localhost, or a Unix socket ("unix:PATH").
func Loopback(addr string) bool {
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

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/internal/testpki"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The access matrix (docs/api.md): every listener kind verdictd offers ×
// every kind of caller × the RPCs on both sides of the line, against real
// daemons. PolicyService and WatchResources need a bearer token or an mTLS
// client whose URI or DNS SAN is on the allow-list (else UNAUTHENTICATED, or
// PERMISSION_DENIED for a verified certificate that is not on the list; a
// token, when sent, is what counts), and so does Decide with explain; a plain
// Decide and WatchRules are open to any client that completes the connection; a TLS handshake that fails (a client
// certificate of another CA, none where one is required, plaintext to TLS)
// means no call at all (UNAVAILABLE). In development mode (no token, no
// allow-list) every caller is admitted.

const matrixToken = "matrix-secret-token"

type listenerKind struct {
	name     string
	tls      bool // the listener speaks TLS
	verifies bool // it verifies client certificates (--tls-client-ca)
	requires bool // --tls-require-client-cert
	dev      bool // no authorization configured
}

type caller struct {
	name     string
	token    string        // bearer token sent; "" none
	cert     *testpki.Pair // client certificate; nil none
	onList   bool          // the certificate's SAN is on the allow-list
	trusted  bool          // the certificate is of the listener's CA
	force    bool          // send the certificate even if the server's CA list does not name its issuer
	insecure bool          // plaintext client
}

// outcome is the code a caller gets from an RPC on a listener.
func outcome(l listenerKind, c caller, needsAuth bool) codes.Code {
	if c.cert != nil && (!l.verifies || !c.trusted && !c.force) {
		// Not asked for one, or (Go's TLS client) asked for one of CAs its
		// own is not of: the client sends no certificate.
		c.cert = nil
	}
	switch {
	case c.insecure != !l.tls:
		return codes.Unavailable // plaintext to TLS, or TLS to plaintext
	case l.verifies && c.cert != nil && !c.trusted, l.requires && c.cert == nil:
		return codes.Unavailable // the handshake fails
	case !needsAuth || l.dev:
		return codes.OK
	case c.token != "" && c.token == matrixToken:
		return codes.OK
	case c.token != "":
		return codes.Unauthenticated
	case c.cert != nil && l.verifies && c.onList:
		return codes.OK
	case c.cert != nil && l.verifies:
		return codes.PermissionDenied
	}
	return codes.Unauthenticated
}

func TestAccessMatrix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "verdict matrix CA")
	caFile := ca.Write(t, dir, "ca")
	srvCert, srvKey := ca.Server(t).Write(t, dir, "server")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(matrixToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	onList := ca.Client(t, nil, "spiffe://verdict.test/ops")
	dnsOnList := ca.Client(t, []string{"ops.verdict.test"})
	offList := ca.Client(t, []string{"intruder.example"}, "spiffe://verdict.test/intruder")
	stranger := testpki.NewCA(t, "another CA").Client(t, nil, "spiffe://verdict.test/ops")

	bootstrap := []string{"--bootstrap", "examples/policies.yaml"}
	tlsArgs := []string{"--tls-cert", srvCert, "--tls-key", srvKey}
	mtlsArgs := append(append([]string{}, tlsArgs...), "--tls-client-ca", caFile,
		"--allow-identity", "spiffe://verdict.test/ops", "--allow-identity", "ops.verdict.test", "--auth-token-file", tokenFile)
	listeners := []struct {
		kind listenerKind
		args []string
	}{
		{listenerKind{name: "plain, development mode", dev: true}, nil},
		{listenerKind{name: "plain, token"}, []string{"--auth-token-file", tokenFile}},
		{listenerKind{name: "TLS, token", tls: true}, append(append([]string{}, tlsArgs...), "--auth-token-file", tokenFile)},
		{listenerKind{name: "mTLS, token and allow-list", tls: true, verifies: true}, mtlsArgs},
		{listenerKind{name: "mTLS, client certificate required", tls: true, verifies: true, requires: true},
			append(append([]string{}, mtlsArgs...), "--tls-require-client-cert")},
	}
	callers := []caller{
		{name: "plaintext, no credentials", insecure: true},
		{name: "plaintext, wrong token", insecure: true, token: "wrong"},
		{name: "plaintext, token", insecure: true, token: matrixToken},
		{name: "TLS, no credentials"},
		{name: "TLS, wrong token", token: "wrong"},
		{name: "TLS, token", token: matrixToken},
		{name: "URI SAN on the list", cert: onList, onList: true, trusted: true},
		{name: "DNS SAN on the list", cert: dnsOnList, onList: true, trusted: true},
		{name: "certificate off the list", cert: offList, trusted: true},
		{name: "certificate off the list, token", cert: offList, trusted: true, token: matrixToken},
		{name: "certificate on the list, wrong token", cert: onList, onList: true, trusted: true, token: "wrong"},
		{name: "certificate of another CA", cert: stranger, onList: true},
		{name: "certificate of another CA, sent anyway", cert: stranger, onList: true, force: true},
	}
	daemons := make([]*daemon, len(listeners))
	var wg sync.WaitGroup
	for i, l := range listeners {
		wg.Go(func() { daemons[i] = startDaemon(t, append(append([]string{}, bootstrap...), l.args...)...) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, l := range listeners {
		d := daemons[i]
		// Wait for SERVING through a caller that gets in.
		admin := dial(t, d, ca.Pool(), caller{token: matrixToken, cert: onList, trusted: true, insecure: !l.kind.tls})
		waitServing(t, admin)
		for _, c := range callers {
			conn := dial(t, d, ca.Pool(), c)
			for _, rpc := range matrixRPCs {
				name := fmt.Sprintf("%s/%s/%s", l.kind.name, c.name, rpc.name)
				want := outcome(l.kind, c, rpc.needsAuth)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if c.token != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
				}
				err := rpc.call(ctx, conn)
				cancel()
				if got := status.Code(err); got != want {
					t.Errorf("%s: %v, want %s", name, err, want)
				}
			}
		}
	}
}

// dial connects as caller c, trusting pool for the server's certificate.
func dial(t *testing.T, d *daemon, pool *x509.CertPool, c caller) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if !c.insecure {
		cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
		if c.cert != nil {
			cfg.Certificates = []tls.Certificate{c.cert.TLS}
		}
		if c.force {
			cert := c.cert.TLS
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		}
		creds = credentials.NewTLS(cfg)
	}
	return d.conn(t, grpc.WithTransportCredentials(creds))
}

// matrixRPCs: some that need an authorized caller, some that are open.
var matrixRPCs = []struct {
	name      string
	needsAuth bool
	call      func(ctx context.Context, conn *grpc.ClientConn) error
}{
	{"PolicyService.Status", true, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := verdictv1.NewPolicyServiceClient(conn).Status(ctx, &verdictv1.StatusRequest{})
		return err
	}},
	{"PolicyService.Apply (dry run)", true, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := verdictv1.NewPolicyServiceClient(conn).Apply(ctx, &verdictv1.ApplyRequest{DryRun: true,
			Resources: []*verdictv1.Resource{sdPolicy("default", "matrix", "a", "b")}})
		return err
	}},
	{"WatchResources", true, func(ctx context.Context, conn *grpc.ClientConn) error {
		s, err := verdictv1.NewWatchServiceClient(conn).WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}},
	{"Decide", false, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := verdictv1.NewDecisionServiceClient(conn).Decide(ctx, &verdictv1.DecideRequest{
			Source: tags("kuma.io/service", "web"), Destination: tags("kuma.io/service", "backend"), Protocol: "TCP", Port: 8080})
		return err
	}},
	{"Decide with explain", true, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := verdictv1.NewDecisionServiceClient(conn).Decide(ctx, &verdictv1.DecideRequest{
			Source: tags("kuma.io/service", "web"), Destination: tags("kuma.io/service", "backend"), Protocol: "TCP", Port: 8080,
			Explain: true})
		return err
	}},
	{"WatchRules", false, func(ctx context.Context, conn *grpc.ClientConn) error {
		s, err := verdictv1.NewWatchServiceClient(conn).WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("kuma.io/service", "db")})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}},
}

package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// InProcess returns a client connection to this server that never leaves the
// process: each call goes through the server's own gRPC server — its codec
// and receive limits, its interceptors and so the method table (access,
// validation, redaction, limits) — exactly as a call from the network does.
// The explorer (docs/explorer.md) answers its page with it.
//
// A caller is known by what its call carries: a bearer token in the
// "authorization" metadata authorizes it as on the listener; it has no client
// certificate. Its address, in logs and decision records, is name.
//
// The connection is served by net/http's HTTP/2 server over in-memory pipes
// (grpc.Server.ServeHTTP), not by the listener's transport: the listener's
// TLS does not apply to it, nor do its keepalive rules. Once the server stops,
// calls fail with UNAVAILABLE. The caller closes the connection.
func (s *Server) InProcess(name string) (*InProcessConn, error) {
	lis := &pipeListener{name: name, conns: make(chan net.Conn), done: make(chan struct{})}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true) // gRPC's prior knowledge: no TLS, no upgrade
	hs := &http.Server{Handler: http.HandlerFunc(s.serveInProcess), Protocols: &protocols}
	go func() { _ = hs.Serve(lis) }() // ends when the listener closes
	go func() {
		select {
		case <-s.stop: // no new connection; those open answer UNAVAILABLE
			_ = lis.Close()
		case <-lis.done:
		}
	}()
	conn, err := grpc.NewClient("passthrough:///"+name,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(lis.dial),
		// Answers are bounded by the server; a page's request by the method table.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		_ = hs.Close()
		return nil, err
	}
	return &InProcessConn{ClientConn: conn, hs: hs}, nil
}

// InProcessConn is a client connection of InProcess.
type InProcessConn struct {
	*grpc.ClientConn
	hs *http.Server
}

// Close closes the connection, and the in-memory server behind it.
func (c *InProcessConn) Close() error {
	return errors.Join(c.ClientConn.Close(), c.hs.Close())
}

// serveInProcess serves one in-process call; once the server stops, it
// answers UNAVAILABLE as the listener's clients see it (ServeHTTP would close
// the stream without a status).
func (s *Server) serveInProcess(w http.ResponseWriter, r *http.Request) {
	if s.stopping() {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", strconv.Itoa(int(codes.Unavailable)))
		w.Header().Set("Grpc-Message", "the server is stopping")
		w.WriteHeader(http.StatusOK)
		return
	}
	s.grpc.ServeHTTP(w, r)
}

// pipeListener hands the server the server ends of in-memory pipes whose
// client ends dial returns. Close stops dialing and accepting; connections
// already made live until either end closes them.
type pipeListener struct {
	name  string
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

var errPipeClosed = errors.New("in-process listener closed")

func (l *pipeListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- namedConn{Conn: srv, addr: pipeAddr(l.name)}:
		return namedConn{Conn: client, addr: pipeAddr(l.name)}, nil
	case <-l.done:
	case <-ctx.Done():
	}
	_ = client.Close()
	_ = srv.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, errPipeClosed
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, errPipeClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.name) }

// namedConn is a pipe end whose addresses are the listener's name.
type namedConn struct {
	net.Conn
	addr pipeAddr
}

func (c namedConn) LocalAddr() net.Addr  { return c.addr }
func (c namedConn) RemoteAddr() net.Addr { return c.addr }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

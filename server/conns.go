package server

import (
	"context"
	"net"

	"google.golang.org/grpc/peer"
)

// connListener wraps the listener Serve is given so that a handler can close
// its caller's connection: each accepted connection reports a RemoteAddr
// (connAddr) that carries it, and gRPC hands that address to the handler's
// context as the peer's (through TLS too: tls.Conn asks the connection
// beneath). Its String is the address's own: logs and the decision log see no
// difference.
type connListener struct{ net.Listener }

func (l connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &trackedConn{Conn: c, addr: connAddr{Addr: c.RemoteAddr(), conn: c}}, nil
}

type trackedConn struct {
	net.Conn
	addr connAddr
}

func (c *trackedConn) RemoteAddr() net.Addr { return c.addr }

// connAddr is a peer address that knows its connection.
type connAddr struct {
	net.Addr
	conn net.Conn
}

// closeCallerConn closes the transport connection of the call ctx belongs to,
// and with it every stream and call on it; false when the connection is not
// known (a listener Serve did not wrap).
func closeCallerConn(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	a, ok := p.Addr.(connAddr)
	if !ok || a.conn == nil {
		return false
	}
	_ = a.conn.Close()
	return true
}

// Package listen opens verdict's gRPC listeners: a TCP address ("host:port")
// or a Unix domain socket ("unix:PATH" or "unix:///ABSOLUTE/PATH", the forms
// gRPC clients dial). A sidecar on the same host saves the TCP stack with a
// socket; access to it is the file's: connecting needs write permission on it
// (the process umask decides, 0755 by default: the owner only).
package listen

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// maxSocketPath is the room Linux has for a socket's path (sun_path, 108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// SocketPath returns the path of a "unix:" address; ok is false for any other.
func SocketPath(addr string) (path string, ok bool) {
	rest, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return "", false
	}
	if p, abs := strings.CutPrefix(rest, "//"); abs {
		rest = p // unix:///run/verdict.sock
	}
	return rest, true
}

// Check validates a listen address without opening it.
func Check(addr string) error {
	path, ok := SocketPath(addr)
	if !ok {
		_, _, err := net.SplitHostPort(addr)
		return err
	}
	switch {
	case path == "":
		return errors.New("unix: the socket path is empty")
	case len(path) > maxSocketPath:
		return fmt.Errorf("unix: the socket path is %d bytes, over the limit of %d", len(path), maxSocketPath)
	}
	return nil
}

// Listen opens addr. For a socket, a file left at the path by a process that
// is gone is removed first; a socket someone still serves on is an error, and
// so is any other file there.
func Listen(addr string) (net.Listener, error) {
	if err := Check(addr); err != nil {
		return nil, err
	}
	path, ok := SocketPath(addr)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("unix: %s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			_ = c.Close() // only a probe
			return nil, fmt.Errorf("unix: %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("unix: remove the stale socket: %w", err)
		}
	}
	return net.Listen("unix", path) // the socket file is removed when the listener closes
}

// FreePorts returns n distinct loopback ports that were free a moment ago
// (held together, so they differ). Another process may take one before the
// caller binds it: callers that start servers on them retry on a bind error.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close() // only held to keep the ports apart
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

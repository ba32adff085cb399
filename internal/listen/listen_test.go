package listen

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSocketPath(t *testing.T) {
	for addr, want := range map[string]string{
		"unix:/run/verdict.sock":   "/run/verdict.sock",
		"unix:///run/verdict.sock": "/run/verdict.sock",
		"unix:verdict.sock":        "verdict.sock",
	} {
		if got, ok := SocketPath(addr); !ok || got != want {
			t.Errorf("%s: %q %v, want %q", addr, got, ok, want)
		}
	}
	if _, ok := SocketPath("127.0.0.1:7070"); ok {
		t.Error("a TCP address taken for a socket")
	}
}

func TestCheck(t *testing.T) {
	for addr, want := range map[string]string{
		"unix:":                             "socket path is empty",
		"unix:/" + strings.Repeat("x", 200): "over the limit of 107",
		"127.0.0.1":                         "missing port",
		"unix:/tmp/ok.sock":                 "",
		"127.0.0.1:0":                       "",
	} {
		err := Check(addr)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%.30s: %v, want %q", addr, err, want)
		}
	}
}

func TestListenSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "v.sock")
	addr := "unix:" + path

	l, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	go func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}(l)
	if _, err := Listen(addr); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second listener on a served socket: %v", err)
	}
	l.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket file outlived its listener: %v", err)
	}

	// A stale socket (its process gone, the file left) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	l2, err := Listen(addr)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	l2.Close()

	// Any other file is left alone.
	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(addr); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("over a regular file: %v", err)
	}
}

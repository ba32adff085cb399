package dial

import "testing"

// TestLoopback: a token goes in plaintext only to this host.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true, "localhost:7070": true, "[::1]:7070": true, "unix:/run/verdict.sock": true,
		"unix:///run/verdict.sock": true, "10.0.0.1:7070": false, "verdict.example:7070": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// A token is refused in plaintext beyond loopback, and goes with TLS.
func TestTokenNeedsTLSBeyondLoopback(t *testing.T) {
	if _, err := (Options{Server: "10.0.0.1:7070", Token: "t"}).DialOptions(); err == nil {
		t.Error("a token in plaintext to 10.0.0.1 was accepted")
	}
	if _, err := (Options{Server: "127.0.0.1:7070", Token: "t"}).DialOptions(); err != nil {
		t.Errorf("a token in plaintext to loopback: %v", err)
	}
	if _, err := (Options{Server: "10.0.0.1:7070", ServerName: "verdict", Token: "t"}).DialOptions(); err != nil {
		t.Errorf("a token over TLS: %v", err)
	}
	if _, err := (Options{Server: "10.0.0.1:7070", CertFile: "c.pem"}).DialOptions(); err == nil {
		t.Error("--tls-cert without --tls-key was accepted")
	}
}

package main

import "testing"

// TestLoopback: a token goes in plaintext only to this host.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true, "localhost:7070": true, "[::1]:7070": true, "unix:/run/verdict.sock": true,
		"unix:///run/verdict.sock": true, "10.0.0.1:7070": false, "verdict.example:7070": false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

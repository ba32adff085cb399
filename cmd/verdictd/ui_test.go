package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --ui-listen follows --listen's rules; the explorer's callers authorize with
// the token.
func TestConfigValidateUI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		return validConfig(dir)
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"off", func(*Config) {}, ""},
		{"loopback, development mode", func(c *Config) { c.UIListen = "127.0.0.1:7072" }, ""},
		{"localhost, development mode", func(c *Config) { c.UIListen = "localhost:7072" }, ""},
		{"IPv6 loopback", func(c *Config) { c.UIListen = "[::1]:7072" }, ""},
		{"beyond loopback, development mode", func(c *Config) { c.UIListen = "0.0.0.0:7072" }, "--ui-listen 0.0.0.0:7072 is beyond loopback: configure authorization"},
		{"every interface, development mode", func(c *Config) { c.UIListen = ":7072" }, "is beyond loopback: configure authorization"},
		{"beyond loopback, token, no TLS", func(c *Config) { c.UIListen, c.AuthTokenFile = "0.0.0.0:7072", file }, "--ui-listen 0.0.0.0:7072 is beyond loopback without TLS"},
		{"beyond loopback, token, TLS", func(c *Config) {
			c.UIListen, c.AuthTokenFile, c.TLSCert, c.TLSKey = "0.0.0.0:7072", file, file, file
		}, ""},
		{"beyond loopback, token, insecure", func(c *Config) {
			c.UIListen, c.AuthTokenFile, c.InsecureListen = "0.0.0.0:7072", file, true
		}, ""},
		{"allow-list without a token", func(c *Config) {
			c.UIListen, c.TLSCert, c.TLSKey, c.TLSClientCA, c.AllowIdentities = "127.0.0.1:7072", file, file, file, []string{"spiffe://a/b"}
		}, "set --auth-token-file"},
		{"a host name as address", func(c *Config) { c.UIListen = "example.com:7072" }, "--ui-listen"},
		{"a Unix socket", func(c *Config) { c.UIListen = "unix:" + filepath.Join(dir, "ui.sock") }, "not a Unix socket"},
		{"hosts", func(c *Config) { c.UIListen, c.UIHosts = "127.0.0.1:7072", []string{"verdict.example.com"} }, ""},
		{"a host with a port", func(c *Config) { c.UIListen, c.UIHosts = "127.0.0.1:7072", []string{"verdict.example.com:80"} }, "--ui-host"},
		{"hosts without the explorer", func(c *Config) { c.UIHosts = []string{"verdict.example.com"} }, "--ui-host needs --ui-listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mod(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

func TestParseFlagsUI(t *testing.T) {
	t.Parallel()
	env := map[string]string{"VERDICT_UI_LISTEN": "127.0.0.1:7072", "VERDICT_UI_HOST": "a.example, b.example"}
	c, err := parseFlags(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.UIListen != "127.0.0.1:7072" || strings.Join(c.UIHosts, ",") != "a.example,b.example" {
		t.Errorf("environment not read: %q %q", c.UIListen, c.UIHosts)
	}
	if c, _ := parseFlags(nil, func(string) string { return "" }, io.Discard); c.UIListen != "" {
		t.Errorf("the explorer is on by default: %q", c.UIListen)
	}
}

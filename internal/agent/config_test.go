package agent

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func(args ...string) Config {
		c, err := ParseFlags(append([]string{"--token-file", tok}, args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"by name", base("--workload", "web,db"), ""},
		{"by interfaces", base("--interfaces", "eth0"), ""},
		{"nothing guarded", base(), "name the workloads to guard"},
		{"a name twice", base("--workload", "web", "--workload", "web"), `"web" given twice`},
		{"bad table", base("--workload", "w", "--table", "my table"), "--table"},
		{"bad stance", base("--workload", "w", "--initial", "reject"), "--initial"},
		{"token in plaintext beyond loopback", base("--workload", "w", "--server", "10.0.0.1:7070"), "beyond loopback"},
		{"token over TLS beyond loopback", base("--workload", "w", "--server", "10.0.0.1:7070", "--tls-ca", tok), ""},
		{"no auth", func() Config { c := base("--workload", "w"); c.TokenFile = ""; return c }(), "authenticate to verdictd"},
		{"no-auth on loopback", func() Config { c := base("--workload", "w"); c.TokenFile, c.NoAuth = "", true; return c }(), ""},
		{"no-auth beyond loopback", func() Config {
			c := base("--workload", "w", "--server", "10.0.0.1:7070")
			c.TokenFile, c.NoAuth = "", true
			return c
		}(), "--no-auth is for"},
		{"cert without key", base("--workload", "w", "--tls-cert", tok), "go together"},
		{"missing netns", base("--workload", "w", "--netns", "/nonexistent/ns"), "--netns"},
		{"bad backoff", base("--workload", "w", "--backoff-min", "2s", "--backoff-max", "1s"), "--backoff"},
		{"bad metrics address", base("--workload", "w", "--metrics-listen", "nope"), "--metrics-listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFlagsEnvMirrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"VERDICT_LISTEN":           "127.0.0.1:9000",
		"VERDICT_ETCD_ENDPOINTS":   "http://a:2379, http://b:2379",
		"VERDICT_SHUTDOWN_TIMEOUT": "3s",
		"VERDICT_INSECURE_LISTEN":  "true",
		"VERDICT_ALLOW_IDENTITY":   "spiffe://x/a",
	}
	c, err := parseFlags([]string{"--listen", "127.0.0.1:9001", "--allow-identity", "dns.example", "--allow-identity", "spiffe://x/b"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9001" {
		t.Errorf("the flag must win over the environment: %q", c.Listen)
	}
	if len(c.EtcdEndpoints) != 2 || c.EtcdEndpoints[1] != "http://b:2379" || c.ShutdownTimeout != 3*time.Second || !c.InsecureListen {
		t.Errorf("environment not read: %+v", c)
	}
	if strings.Join(c.AllowIdentities, ",") != "dns.example,spiffe://x/b" {
		t.Errorf("identities %v: the command line replaces the environment's list", c.AllowIdentities)
	}
	if c.MetricsListen != defaultMetricsListen || c.EtcdPrefix != defaultPrefix || c.DataDir != defaultDataDir {
		t.Errorf("defaults: %+v", c)
	}
	if _, err := parseFlags(nil, func(k string) string { return map[string]string{"VERDICT_INSECURE_LISTEN": "maybe"}[k] }, io.Discard); err == nil {
		t.Error("a bad boolean in the environment was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config { return validConfig(dir) }
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"development mode on loopback", func(*Config) {}, ""},
		{"localhost", func(c *Config) { c.Listen = "localhost:7070" }, ""},
		{"decision log sample 0", func(c *Config) { c.DecisionLogSample = 0 }, "--decision-log-sample"},
		{"decision log sample over 1", func(c *Config) { c.DecisionLogSample = 1.5 }, "--decision-log-sample"},
		{"decision log queue 0", func(c *Config) { c.DecisionLogQueue = 0 }, "--decision-log-queue"},
		{"decision log files 0", func(c *Config) { c.DecisionLogMaxFiles = 0 }, "--decision-log-max-files"},
		{"decision log file size under 64 KiB", func(c *Config) { c.DecisionLogMaxSize = 1000 }, "--decision-log-max-size"},
		{"decision log file size under the record cap", func(c *Config) {
			c.DecisionLogMaxSize, c.DecisionLogMaxRecord = 64<<10, 128<<10
		}, "--decision-log-max-size"},
		{"decision record cap under 1 KiB", func(c *Config) { c.DecisionLogMaxRecord = 100 }, "--decision-log-max-record"},
		{"negative repeats window", func(c *Config) { c.DecisionLogRepeatWindow = -time.Second }, "--decision-log-repeats-window"},
		{"admission per caller off", func(c *Config) { c.AdmitPerCaller = -1 }, ""},
		{"admission per caller of 1", func(c *Config) { c.AdmitPerCaller = 1 }, ""},
		{"admission per caller under -1", func(c *Config) { c.AdmitPerCaller = -2 }, "--admit-per-caller"},
		{"IPv6 loopback", func(c *Config) { c.Listen = "[::1]:7070" }, ""},
		{"beyond loopback without authorization", func(c *Config) { c.Listen = "0.0.0.0:7070" }, "configure authorization first"},
		{"all interfaces without authorization", func(c *Config) { c.Listen = ":7070" }, "configure authorization first"},
		{"beyond loopback with a token but no TLS", func(c *Config) { c.Listen = "0.0.0.0:7070"; c.AuthTokenFile = file }, "without TLS"},
		{"beyond loopback, token, insecure", func(c *Config) { c.Listen = "0.0.0.0:7070"; c.AuthTokenFile = file; c.InsecureListen = true }, ""},
		{"beyond loopback, mTLS allow-list", func(c *Config) {
			c.Listen, c.TLSCert, c.TLSKey, c.TLSClientCA, c.AllowIdentities = "10.0.0.1:7443", file, file, file, []string{"spiffe://a/b"}
		}, ""},
		{"allow-list without client CA", func(c *Config) { c.AllowIdentities = []string{"x"} }, "--allow-identity needs --tls-client-ca"},
		{"cert without key", func(c *Config) { c.TLSCert = file }, "go together"},
		{"missing file", func(c *Config) { c.Bootstrap = filepath.Join(dir, "nope") }, "--bootstrap"},
		{"etcd TLS without endpoints", func(c *Config) { c.EtcdCA = file }, "--etcd-endpoints"},
		{"bad prefix", func(c *Config) { c.EtcdPrefix = "verdict/" }, "--etcd-prefix"},
		{"bad log level", func(c *Config) { c.LogLevel = "loud" }, "--log-level"},
		{"host name", func(c *Config) { c.Listen = "example.com:7070" }, "--listen"},
		{"unix socket, development mode", func(c *Config) { c.Listen = "unix:" + filepath.Join(dir, "v.sock") }, ""},
		{"metrics beyond loopback in development mode", func(c *Config) { c.MetricsListen = "0.0.0.0:7071" }, "--metrics-listen 0.0.0.0:7071 is beyond loopback"},
		{"metrics on every interface in development mode", func(c *Config) { c.MetricsListen = ":7071" }, "--metrics-listen :7071 is beyond loopback"},
		{"metrics on IPv6 loopback", func(c *Config) { c.MetricsListen = "[::1]:7071" }, ""},
		{"metrics disabled", func(c *Config) { c.MetricsListen = "" }, ""},
		{"metrics beyond loopback with a token", func(c *Config) {
			c.Listen, c.MetricsListen, c.AuthTokenFile, c.InsecureListen = "0.0.0.0:7070", "0.0.0.0:7071", file, true
		}, ""},
		{"unix socket, empty path", func(c *Config) { c.Listen = "unix:" }, "--listen: unix: the socket path is empty"},
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

func TestTracesWanted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
	}
	for _, tc := range tests {
		if got := tracesWanted(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestParseRetention(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		retention time.Duration
		off       bool
		revisions int64
		bad       bool
	}{
		{name: "defaults", retention: 168 * time.Hour, revisions: 100000},
		{name: "a duration and a count", args: []string{"--retention", "24h", "--retention-revisions", "5000"}, retention: 24 * time.Hour, revisions: 5000},
		{name: "off", args: []string{"--retention", "off"}, off: true, revisions: 100000},
		{name: "the environment", env: map[string]string{"VERDICT_RETENTION": "off", "VERDICT_RETENTION_REVISIONS": "7"}, off: true, revisions: 7},
		{name: "the flag over the environment", args: []string{"--retention", "1h"}, env: map[string]string{"VERDICT_RETENTION": "off"}, retention: time.Hour, revisions: 100000},
		{name: "not a duration", args: []string{"--retention", "forever"}, bad: true},
		{name: "not a duration in the environment", env: map[string]string{"VERDICT_RETENTION": "week"}, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseFlags(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.bad {
				if err == nil {
					t.Fatalf("accepted: %+v", c)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Retention != tc.retention || c.RetentionOff != tc.off || c.RetentionRevisions != tc.revisions {
				t.Fatalf("retention %v off %v revisions %d", c.Retention, c.RetentionOff, c.RetentionRevisions)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
	c, _ := parseFlags([]string{"--retention", "0s", "--retention-revisions", "0"}, func(string) string { return "" }, io.Discard)
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--retention 0s") || !strings.Contains(err.Error(), "--retention-revisions 0") {
		t.Fatalf("Validate of a zero retention and count: %v", err)
	}
}

// validConfig is a Config that validates, on the data directory dir: the
// tables of Validate's tests change one thing of it at a time.
func validConfig(dir string) Config {
	return Config{Listen: defaultListen, MetricsListen: defaultMetricsListen, EtcdPrefix: defaultPrefix, DataDir: dir,
		LogLevel: "info", LogFormat: "text", ShutdownTimeout: time.Second, DecisionLogSample: 1, DecisionLogQueue: 10,
		DecisionLogMaxSize: defaultDecisionLogMaxSize, DecisionLogMaxFiles: 1, DecisionLogMaxRecord: 4 << 10,
		Retention: time.Hour, RetentionRevisions: 10}
}

// --watch-conditions is on by default; the flag or the environment turns
// it off.
func TestParseWatchConditions(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want bool
		bad  bool
	}{
		{name: "on by default", want: true},
		{name: "the flag turns it off", args: []string{"--watch-conditions=false"}, want: false},
		{name: "the environment turns it off", env: map[string]string{"VERDICT_WATCH_CONDITIONS": "false"}, want: false},
		{name: "the flag over the environment", args: []string{"--watch-conditions"}, env: map[string]string{"VERDICT_WATCH_CONDITIONS": "false"}, want: true},
		{name: "not a boolean", env: map[string]string{"VERDICT_WATCH_CONDITIONS": "maybe"}, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseFlags(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.bad {
				if err == nil {
					t.Fatalf("accepted: WatchConditions %v", c.WatchConditions)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.WatchConditions != tc.want {
				t.Fatalf("WatchConditions %v, want %v", c.WatchConditions, tc.want)
			}
		})
	}
}

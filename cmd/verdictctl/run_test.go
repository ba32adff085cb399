package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func TestParseTags(t *testing.T) {
	t.Parallel()
	got, err := parseTags("kuma.io/service=web, env=prod,empty=")
	if err != nil || len(got) != 3 || got["kuma.io/service"] != "web" || got["env"] != "prod" || got["empty"] != "" {
		t.Errorf("%v %v", got, err)
	}
	for _, bad := range []string{"novalue", "=v", "a=b,,"} {
		if _, err := parseTags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestKeyOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"default/policies/TrafficLog/x"}, "default/policies/TrafficLog/x"},
		{[]string{"policy", "x"}, "m/policies/T/x"},
		{[]string{"scope", "Apps:HR"}, "m/scopes/Apps:HR"},
		{[]string{"mesh", "prod"}, "prod/mesh"},
		{[]string{"mesh"}, "m/mesh"},
	}
	for _, tc := range tests {
		if got, err := keyOf(tc.args, "m", "T"); err != nil || got != tc.want {
			t.Errorf("%v: %q %v, want %q", tc.args, got, err, tc.want)
		}
	}
	if _, err := keyOf([]string{"thing", "x"}, "m", "T"); err == nil {
		t.Error("an unknown kind was accepted")
	}
}

// TestPrintStoredIsReappliable: get's YAML decodes back to the same resource.
func TestPrintStoredIsReappliable(t *testing.T) {
	t.Parallel()
	rs, err := resource.DecodeYAML([]byte(`kind: Policy
name: p
type: TrafficLog
sources: [{match: {app: web}, expressions: [{key: ip, operator: CIDR, values: [10.0.0.0/8]}]}]
destinations: [{}]
ports: [{protocol: TCP, ports: "80,443"}]
conf: {backend: splunk, sampling: 0.25, n: 3, tags: [a, b], nested: {x: true}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := apiconv.ResourceToProto(rs[0])
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := printStored(&buf, &verdictv1.StoredResource{Key: "default/policies/TrafficLog/p", Resource: pr, ModRevision: 7}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "# key: default/policies/TrafficLog/p") || !strings.Contains(buf.String(), "\nkind: Policy\n") {
		t.Errorf("output:\n%s", buf.String())
	}
	back, err := resource.DecodeYAML(buf.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	a, _ := resource.EncodeJSON(rs[0])
	b, _ := resource.EncodeJSON(back[0])
	if !bytes.Equal(a, b) {
		t.Errorf("round trip changed the resource:\n%s\n%s", a, b)
	}
}

func TestUsageAndExitCodes(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }, stdin: strings.NewReader("")}
	if code := runEnv(context.Background(), nil, e); code != exitUsage {
		t.Errorf("no command: %d", code)
	}
	if code := runEnv(context.Background(), []string{"help"}, e); code != exitOK || !strings.Contains(out.String(), "Exit codes") {
		t.Errorf("help: %d", code)
	}
	if code := runEnv(context.Background(), []string{"decide", "-h"}, e); code != exitOK {
		t.Errorf("decide -h: %d", code)
	}
	if code := runEnv(context.Background(), []string{"apply"}, e); code != exitUsage {
		t.Errorf("apply without -f: %d", code)
	}
	if code := runEnv(context.Background(), []string{"apply", "-f", "/nonexistent"}, e); code != exitError {
		t.Errorf("apply of a missing file: %d", code)
	}
	if code := runEnv(context.Background(), []string{"get", "--server", "127.0.0.1:1", "--timeout", "1s", "mesh", "x", "--token-file", "/nonexistent"}, e); code != exitError {
		t.Errorf("get with a missing token file: %d", code)
	}
}

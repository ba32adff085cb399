package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

const cliSet = `kind: Mesh
name: cli
---
kind: Scope
mesh: cli
name: Apps
selectors: [{match: {env: prod}}]
---
kind: Policy
mesh: cli
name: web-to-api
scope: Apps
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
mesh: cli
name: tried-deny
scope: Apps
rank: Absolute
mode: Audit
action: DENY
sources: [{match: {app: web}}]
destinations: [{match: {app: api}}]
---
kind: Policy
mesh: cli
name: log-all
type: TrafficLog
sources: [{}]
destinations: [{}]
conf: {backend: file}
`

// TestCommands runs verdictctl's commands against a real server (issue 18):
// required endpoints, -o on every command, global flags before the command,
// list -o wide and its warning.
func TestCommands(t *testing.T) {
	ts := startServer(t)
	c := ctl{ts: ts}
	if r := c.run(t, cliSet, "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("apply: %d\n%s%s", r.code, r.out, r.errOut)
	}
	ts.keys(t, "cli/") // the snapshot holds the write
	flow := []string{"--mesh", "cli", "--src", "app=web,env=prod", "--dst", "app=api,env=prod"}
	tests := []struct {
		args    []string
		code    int
		want    []string
		notWant []string
	}{
		// required ends (finding 4)
		{args: []string{"decide", "--mesh", "cli", "--dst", "app=api"}, code: 2, want: []string{"name the source: --src k=v,.."}},
		{args: []string{"explain", "--mesh", "cli", "--src", "app=web"}, code: 2, want: []string{"name the destination"}},
		{args: []string{"decide", "--mesh", "cli", "--src", "app=web", "--src-any", "--dst", "app=api"}, code: 2, want: []string{"exclude each other"}},
		{args: []string{"decide", "--mesh", "cli", "--src", "", "--dst", "app=api"}, code: 2, want: []string{"--src is empty"}},
		{args: []string{"decide", "--mesh", "cli", "--src-any", "--dst", "app=api,env=prod"}, code: 1, want: []string{"DENY"}},
		{args: append([]string{"decide"}, flow...), code: 0, want: []string{"ALLOW by policy web-to-api",
			"audit: would be DENY by policy tried-deny"}},
		// audit rules marked in explain (issue 17)
		{args: append([]string{"explain"}, flow...), code: 0, want: []string{"tried-deny", "DENY (audit)"}},
		// -o everywhere (finding 3)
		{args: append([]string{"decide", "-o", "yaml"}, flow...), code: 0, want: []string{"action: ACTION_ALLOW", "policy: web-to-api"}},
		{args: append([]string{"decide", "-o", "json"}, flow...), code: 0, want: []string{`"action": "ACTION_ALLOW"`}},
		{args: append([]string{"decide", "-o", "wide"}, flow...), code: 0, want: []string{"source: ", "destination: "}},
		{args: append([]string{"decide", "-o", "JSON"}, flow...), code: 2, want: []string{`-o JSON: not one of text, wide, json, yaml`, "Run 'verdictctl decide --help' for usage."}},
		{args: append([]string{"explain", "-o", "xml"}, flow...), code: 2},
		{args: []string{"resolve", "-o", "xml", "--mesh", "cli", "--type", "TrafficLog", "--dst", "app=api"}, code: 2},
		{args: []string{"resolve", "-o", "yaml", "--mesh", "cli", "--type", "TrafficLog", "--src", "app=web", "--dst", "app=api"}, code: 0, want: []string{"policy: log-all"}},
		{args: []string{"get", "-o", "xml", "cli/mesh"}, code: 2},
		{args: []string{"get", "-o", "json", "cli/mesh"}, code: 0, want: []string{`"key": "cli/mesh"`}},
		{args: []string{"list", "-o", "xml", "cli/"}, code: 2},
		{args: []string{"list", "-o", "table", "cli/"}, code: 0, want: []string{"KEY", "cli/scopes/Apps"}},
		{args: []string{"list", "-o", "wide", "cli/"}, code: 0,
			want: []string{"KIND", "TYPE", "MODE", "ACTION", "SCOPE", "AGE", "cli/policies/TrafficLog/log-all", "TrafficLog", "Apps", "Audit"}},
		{args: []string{"list", "cli/polices/"}, code: 0, want: []string{"warning: no resource has the prefix \"cli/polices/\""}},
		{args: []string{"list", "nosuchmesh/"}, code: 0, notWant: []string{"warning"}},
		{args: []string{"status", "-o", "xml"}, code: 2},
		{args: []string{"status", "-o", "yaml"}, code: 0, want: []string{"synced: true"}},
		{args: []string{"watch", "-o", "xml"}, code: 2},
		{args: []string{"apply", "-o", "xml", "-f", "-"}, code: 2},
		{args: []string{"delete", "-o", "xml", "cli/mesh"}, code: 2},
		{args: []string{"apply", "-o", "json", "--dry-run", "-f", "-"}, code: 0, want: []string{`"dryRun": true`, `"cli/policies/TrafficPermission/web-to-api"`}},
		// version, completion, inspect (findings 10, 9)
		{args: []string{"version"}, code: 0, want: []string{"client: ", "server: "}, notWant: []string{"warning", "unknown"}},
		{args: []string{"version", "-o", "json"}, code: 0, want: []string{`"client": `, `"server": `}},
		{args: []string{"completion", "bash"}, code: 0, want: []string{"complete -o default -F _verdictctl verdictctl", "decide) flags=", "--src-workload", "inspect"}},
		{args: []string{"completion", "zsh"}, code: 0, want: []string{"bashcompinit", "_verdictctl"}},
		{args: []string{"completion", "fish"}, code: 0, want: []string{"__fish_seen_subcommand_from logs' -l action"}},
		{args: []string{"completion", "pwsh"}, code: 2},
		{args: []string{"inspect", "--mesh", "cli", "--workload", "app=web,env=prod", "--type", "TrafficPermission", "--type", "TrafficLog"}, code: 0,
			want: []string{"workload app=web,env=prod", "scopes: Apps (most specific: Apps)", "TrafficPermission rules, in decision order:",
				"web-to-api", "app=api", "TrafficLog rules", "log-all", "TrafficLog effective configuration: none for one workload (destination: type TrafficLog needs a source and a destination"}},
		{args: []string{"inspect", "--mesh", "cli", "--workload", "app=web,env=prod", "-o", "json"}, code: 0, want: []string{`"scopes": [`, `"Apps"`, `"TrafficPermission": {`}},
		{args: []string{"inspect", "--mesh", "cli"}, code: 2, want: []string{"name the workload"}},
		// global flags before the command (finding 6)
		{args: []string{"--server", ts.addr, "status"}, code: 0, want: []string{"synced:         true"}},
		{args: []string{"--server=" + ts.addr, "-o", "json", "get", "cli/mesh"}, code: 0, want: []string{`"key": "cli/mesh"`}},
		{args: []string{"--mesh", "cli", "status"}, code: 2, want: []string{"--mesh is not a global flag"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cc := c
			if tc.args[0] == "--server" || strings.HasPrefix(tc.args[0], "--server=") {
				cc.ts = nil // the flag alone names the server
			}
			stdin := ""
			if tc.args[0] == "apply" {
				stdin = cliSet
			}
			r := cc.run(t, stdin, tc.args...)
			all := r.out + r.errOut
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\n%s", r.code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(all, w) {
					t.Errorf("output has %q:\n%s", w, all)
				}
			}
		})
	}
}

// TestEndpointFlags: each form fills its field of the Endpoint; two forms
// of one end are refused.
func TestEndpointFlags(t *testing.T) {
	tests := []struct {
		args  []string
		want  string // the source Endpoint as JSON
		given bool
		err   string
	}{
		{args: []string{"--src", "app=web"}, want: `{"tags":{"app":"web"}}`, given: true},
		{args: []string{"--src-workload", "web-1"}, want: `{"workload":"web-1"}`, given: true},
		{args: []string{"--src-address", "10.0.0.1"}, want: `{"address":"10.0.0.1"}`, given: true},
		{args: []string{"--src-principal", "spiffe://default/web"}, want: `{"principal":"spiffe://default/web"}`, given: true},
		{args: []string{"--src-identity", "42"}, want: `{"identity":"42"}`, given: true},
		{args: []string{"--src-any"}, want: `{}`, given: true},
		{args: nil, want: `{}`},
		{args: []string{"--src-workload", "w", "--src-address", "10.0.0.1"}, err: "exclude each other"},
		{args: []string{"--src", "novalue"}, err: "not key=value"},
	}
	for _, tc := range tests {
		fs := newFlags("t", &env{stderr: &bytes.Buffer{}, stdout: &bytes.Buffer{}})
		var ff flowFlags
		ff.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		ep, given, err := ff.src.endpoint()
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case compactJSON(ep) != tc.want || given != tc.given:
			t.Errorf("%v: %s given %v, want %s given %v", tc.args, compactJSON(ep), given, tc.want, tc.given)
		}
	}
}

// TestSelectorText: peers read as kubectl's selectors, not JSON.
func TestSelectorText(t *testing.T) {
	tests := []struct {
		sel  []*verdictv1.Selector
		want string
	}{
		{nil, "*"},
		{[]*verdictv1.Selector{{}}, "*"},
		{[]*verdictv1.Selector{{Match: map[string]string{"env": "prod", "app": "web"}, Expressions: []*verdictv1.Expression{
			{Key: "tier", Operator: "In", Values: []string{"a", "b"}}, {Key: "x", Operator: "NotIn", Values: []string{"c"}},
			{Key: "team", Operator: "Exists"}, {Key: "legacy", Operator: "DoesNotExist"}, {Key: "ip", Operator: "CIDR", Values: []string{"10.0.0.0/8"}}}}},
			"app=web,env=prod,tier in (a,b),x notin (c),team,!legacy,ip cidr (10.0.0.0/8)"},
		{[]*verdictv1.Selector{{Match: map[string]string{"app": "a"}}, {Match: map[string]string{"app": "b"}}}, "app=a | app=b"},
	}
	for _, tc := range tests {
		if got := selectorsText(tc.sel); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.sel, got, tc.want)
		}
	}
	var buf bytes.Buffer
	printRules(&buf, &verdictv1.WatchRulesResponse{Inbound: &verdictv1.SideRules{Rules: []*verdictv1.Rule{{Policy: "p", Peer: tc0()}}}}, true)
	if !strings.Contains(buf.String(), "app=web,env in (a,b)") || strings.Contains(buf.String(), "{") {
		t.Errorf("printRules:\n%s", buf.String())
	}
}

func tc0() []*verdictv1.Selector {
	return []*verdictv1.Selector{{Match: map[string]string{"app": "web"}, Expressions: []*verdictv1.Expression{{Key: "env", Operator: "In", Values: []string{"a", "b"}}}}}
}

// TestOffline: test (files and directories, -h, -v, --run, -o json|junit,
// exit 1 for failed cases and 3 for files that do not load), validate, fmt.
func TestOffline(t *testing.T) {
	dir := t.TempDir()
	suite := `name: s
resources:
  - {kind: Policy, name: p, sources: [{match: {app: web}}], destinations: [{match: {app: api}}]}
cases:
  - name: allowed
    decide: {source: {tags: {app: web}}, destination: {tags: {app: api}}}
    expect: {action: ALLOW}
  - name: wrong on purpose
    decide: {source: {tags: {app: db}}, destination: {tags: {app: api}}}
    expect: {action: ALLOW}
`
	good := strings.Replace(suite, "  - name: wrong on purpose\n    decide: {source: {tags: {app: db}}, destination: {tags: {app: api}}}\n    expect: {action: ALLOW}\n", "", 1)
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	failing := write("suites/failing.yaml", suite)
	passing := write("ok/good.yaml", good)
	broken := write("broken.yaml", "name: [\n")
	docs := write("docs/set.yaml", cliSet)
	ugly := write("ugly.yaml", "name: \"p\"\nsources:\n- {match: {app: web}}\nkind: Policy  # kept\ndestinations: [{}]\n")
	badDoc := write("bad.yaml", "kind: Policy\nname: p\n\nsources: [{match: {app: web}}]\naction: MAYBE\ndestinations: [{}]\n")
	badSyntax := write("syntax.yaml", "kind: Policy\nname: p\nsources: [{match: {app: web}}\ndestinations: [{}]\n")
	secondDoc := write("second.yaml", "kind: Policy\nname: p\nsources: [{}]\ndestinations: [{}]\n---\n# a comment\nkind: Policy\nname: q\naction: X\nsources: [{}]\ndestinations: [{}]\n")
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"test", "-h"}, 0, nil},
		{[]string{"test", filepath.Join(dir, "ok")}, 0, []string{"1 passed, 0 failed"}},
		{[]string{"test", passing, "-v"}, 0, []string{"PASS " + passing + ": allowed"}},
		{[]string{"test", failing}, 1, []string{"FAIL " + failing + ": wrong on purpose", "1 passed, 1 failed"}},
		{[]string{"test", "--run", "allowed", failing}, 0, []string{"1 passed, 0 failed"}},
		{[]string{"test", "--run", "(", failing}, 2, nil},
		{[]string{"test", broken, passing}, 3, []string{"did not load: " + broken + ":2:1: did not find expected node content", "(1 file did not load)"}},
		{[]string{"test", "-o", "xml", passing}, 2, nil},
		{[]string{"validate", docs}, 0, []string{"5 resources valid"}},
		{[]string{"validate", ugly}, 0, []string{"1 resource valid"}},
		{[]string{"validate", "--whole", docs}, 0, nil},
		// invalid documents in validate: the answer is no (exit 1)
		{[]string{"validate", badDoc}, 1, []string{`"MAYBE" is not ALLOW or DENY`}},
		{[]string{"validate", "-o", "json", badDoc}, 1, []string{`"valid": false`}},
		// file:line:column and the path of the field
		{[]string{"validate", badDoc}, 1, []string{badDoc + `:5:1: documents[0].action: "MAYBE" is not ALLOW or DENY`}},
		{[]string{"validate", badSyntax}, 1, []string{badSyntax + `:3:10: did not find expected ',' or ']'`}},
		{[]string{"validate", secondDoc}, 1, []string{secondDoc + `:9:1: documents[1].action`}},
		{[]string{"fmt", ugly}, 0, []string{"name: p\nsources:\n  - {match: {app: web}}\nkind: Policy  # kept\ndestinations: [{}]\n"}},
		{[]string{"fmt", "--check", ugly}, 1, []string{ugly}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := (ctl{}).run(t, "", tc.args...)
			all := r.out + r.errOut
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\n%s", r.code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
		})
	}
	// -o json and junit are documents a tool can read.
	r := (ctl{}).run(t, "", "test", "-o", "json", failing, broken)
	var rep testReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil || r.code != 3 || rep.Passed != 1 || rep.Failed != 1 || len(rep.LoadErrors) != 1 {
		t.Errorf("test -o json: exit %d, %v %+v\n%s", r.code, err, rep, r.out)
	}
	r = (ctl{}).run(t, "", "test", "-o", "junit", failing)
	var junit struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal([]byte(r.out), &junit); err != nil || r.code != 1 || len(junit.Suites) != 1 || junit.Suites[0].Tests != 2 || junit.Suites[0].Failures != 1 {
		t.Errorf("test -o junit: exit %d, %v %+v\n%s", r.code, err, junit, r.out)
	}
}

// TestResolveSkipped: a policy whose only block was skipped by when reads
// SKIPPED with the block, not OVERRIDDEN (finding 8).
func TestResolveSkipped(t *testing.T) {
	tests := []struct {
		st   *verdictv1.PolicyStatus
		want string
	}{
		{&verdictv1.PolicyStatus{Policy: "p", State: verdictv1.PolicyState_POLICY_STATE_OVERRIDDEN, Skipped: []string{"overrides: when is false"},
			Missing: []*verdictv1.MissingRule{{Rule: "limit", Why: "skipped: overrides: when is false"}}}, "policy p: SKIPPED"},
		{&verdictv1.PolicyStatus{Policy: "p", State: verdictv1.PolicyState_POLICY_STATE_OVERRIDDEN, Skipped: []string{"defaults: when is false"},
			Missing: []*verdictv1.MissingRule{{Rule: "limit", Why: "overridden", By: "q"}}}, "policy p: OVERRIDDEN"},
		{&verdictv1.PolicyStatus{Policy: "p", State: verdictv1.PolicyState_POLICY_STATE_OVERRIDDEN,
			Missing: []*verdictv1.MissingRule{{Rule: "limit", Why: "overridden", By: "q"}}}, "policy p: OVERRIDDEN"},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		printResolution(&buf, &verdictv1.Resolution{Side: "inbound", Status: []*verdictv1.PolicyStatus{tc.st}})
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%v:\n%s\nwant %q", tc.st, buf.String(), tc.want)
		}
	}
}

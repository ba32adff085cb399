package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// offline runs verdictctl against an address nothing listens on: a command
// that made a call would fail with 3, so a 2 says the mistake was found
// before any call.
func offline(t *testing.T, stdin string, args ...string) ctlResult {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb,
		getenv: func(k string) string {
			if k == "VERDICT_SERVER" {
				return "127.0.0.1:1"
			}
			return ""
		}}
	if len(args) > 0 && lookup(args[0]) != nil && !lookup(args[0]).offline { // the others take no --timeout
		args = append(args, "--timeout", "2s")
	}
	code := runEnv(t.Context(), args, e)
	return ctlResult{code: code, out: out.String(), errOut: errb.String()}
}

// TestBadValuesExitTwo walks every command with wrong values: each is a usage
// error (exit 2) found before any call, with a short message and the hint
// line — never the command's whole help.
func TestBadValuesExitTwo(t *testing.T) {
	t.Parallel()
	doc := filepath.Join(t.TempDir(), "doc.yaml")
	if err := os.WriteFile(doc, []byte("kind: Mesh\nname: m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flow := []string{"--src", "app=web", "--dst", "app=db"}
	bad := map[string][][]string{
		"apply":   {{"-o", "JSON", "-f", doc}, {}, {"-f", doc, "extra"}, {"-f", doc, "--lint", "maybe"}},
		"diff":    {{"-o", "wide", "-f", doc}, {}, {"-f", doc, "--from-revision", "3"}, {"--to-revision", "4"}},
		"history": {{}, {"a/mesh", "b/mesh"}, {"--page-size", "0", "m/mesh"}, {"-o", "xml", "m/mesh"}},
		"revert":  {{"m/mesh"}, {"--to-revision", "0", "m/mesh"}, {"--to-revision", "3"}},
		"get":     {{"-o", "xml", "m/mesh"}, {"thing", "x"}, {"--at-revision", "2", "--min-revision", "3", "m/mesh"}},
		"list":    {{"-o", "xml"}, {"a/", "b/"}},
		"delete":  {{"-o", "xml", "m/mesh"}, {}, {"not-a-key/x"}, {"--prefix", "m/", "m/mesh"}},
		"status":  {{"-o", "xml"}, {"extra"}},
		"decide":  {append([]string{"--at", "yesterday"}, flow...), append([]string{"--at-revision", "3", "--at", "-2h"}, flow...), append([]string{"--at-revision", "-1"}, flow...), append([]string{"--proto", "SCTP"}, flow...), append([]string{"--proto", "TCP", "--port", "70000"}, flow...), append([]string{"--port", "8080"}, flow...), {"--dst", "app=db"}, append([]string{"-o", "JSON"}, flow...)},
		"explain": {append([]string{"--proto", "sctp"}, flow...), {"--src", "app=web"}, append([]string{"--port", "0", "--proto", "TCP"}, flow...)},
		"resolve": {{"--type", "TrafficLog"}, {"--dst", "app=db", "--proto", "SCTP"}, {"--dst", "app=db", "--port", "80"}},
		"watch":   {{"-o", "xml"}, {"everything"}, {"rules"}},
		"inspect": {{}, {"--workload", "app=web", "--workload-name", "w"}},
		"logs":    {{"--action", "maybe"}, {"-o", "xml"}},
		"reach": {{"--dst-workload", "db-1", "--src-workload", "web-1"}, {}, {"--dst-workload", "db-1", "--port", "5432"},
			{"--dst-workload", "db-1", "--proto", "SCTP"}, {"--dst-workload", "db-1", "-o", "xml"},
			{"--dst-workload", "db-1", "--at-revision", "3", "--at", "-2h"}},
		"matrix": {{"--port", "80"}, {"--proto", "SCTP"}, {"--src", "novalue"}, {"extra"}, {"--at", "yesterday"},
			{"--at-revision", "2", "--min-revision", "3"}},
		"impact":     {{}, {"--delete", "not-a-key/x"}, {"-f", doc, "--fail-on", "maybe"}, {"-f", doc, "-o", "xml"}},
		"lint":       {{"-o", "xml"}, {"extra"}, {"--at-revision", "0"}, {"-f", doc, "--at-revision", "3"}},
		"test":       {{}, {"-o", "xml", doc}, {"--run", "(", doc}},
		"validate":   {{}, {"-o", "wide", doc}},
		"fmt":        {{}, {"-w", "--check", doc}, {"-w", "-"}},
		"version":    {{"-o", "xml"}, {"extra"}},
		"completion": {{"pwsh"}, {}},
		"help":       {{"decied"}, {"a", "b"}},
	}
	for _, c := range commands() {
		rows, ok := bad[c.name]
		if !ok {
			t.Errorf("command %s has no row with a bad value", c.name)
			continue
		}
		if c.name != "completion" && c.name != "help" {
			rows = append(rows, []string{"--no-such-flag"})
		}
		for _, args := range rows {
			args := append([]string{c.name}, args...)
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				r := offline(t, "", args...)
				if r.code != exitUsage {
					t.Errorf("exit %d, want 2\n%s%s", r.code, r.out, r.errOut)
				}
				if n := strings.Count(r.errOut, "\n"); n == 0 || n > 4 {
					t.Errorf("%d lines on stderr, want a short error and a hint:\n%s", n, r.errOut)
				}
				if !strings.Contains(r.errOut, "Run 'verdictctl ") {
					t.Errorf("no hint line:\n%s", r.errOut)
				}
			})
		}
	}
	if r := offline(t, "", "decied"); r.code != exitUsage {
		t.Errorf("an unknown command: exit %d", r.code)
	}
}

// TestHelp: per-command help with examples, from `help CMD` and `CMD
// --help` alike; flags as the docs write them; suggestions for a command and
// a flag.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		if len(c.examples) == 0 || c.summary == "" || c.about == "" {
			t.Errorf("command %s lacks examples, a summary or an about", c.name)
		}
		if c.name == "help" || c.name == "completion" {
			continue
		}
		h := offline(t, "", "help", c.name)
		direct := offline(t, "", c.name, "--help")
		if h.code != 0 || direct.code != 0 || h.out != direct.out {
			t.Errorf("help %s (exit %d) and %s --help (exit %d) differ:\n%s\n---\n%s", c.name, h.code, c.name, direct.code, h.out, direct.out)
		}
		for _, want := range []string{"Usage: verdictctl " + c.name, "Examples:\n  " + c.examples[0], "Flags:"} {
			if !strings.Contains(h.out, want) {
				t.Errorf("help %s lacks %q:\n%s", c.name, want, h.out)
			}
		}
		// A long flag reads --name, never -name.
		if m := regexp.MustCompile(`(?m)^\s+-[a-z]{2,}`).FindString(h.out); m != "" {
			t.Errorf("help %s writes %q with one dash:\n%s", c.name, m, h.out)
		}
	}
	dec := offline(t, "", "help", "decide").out
	for _, want := range []string{"--dst TAGS", "-o, --output FORMAT", "--port PORT"} {
		if !strings.Contains(dec, want) {
			t.Errorf("help decide lacks %q:\n%s", want, dec)
		}
	}
	if strings.Contains(dec, "\n      --output") || strings.Contains(dec, "\n  -o FORMAT") {
		t.Errorf("-o and --output listed apart:\n%s", dec)
	}
	top := offline(t, "", "help")
	for _, c := range commands() {
		if !strings.Contains(top.out, "  "+c.name+" ") {
			t.Errorf("the command list lacks %s", c.name)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"decied"}, "Did you mean decide?"},
		{[]string{"aply"}, "Did you mean apply?"},
		{[]string{"decide", "--srcc", "a=b"}, "Did you mean --src?"},
		{[]string{"apply", "--dryrun"}, "Did you mean --dry-run?"},
		{[]string{"list", "--outptu", "json"}, "Did you mean --output?"},
	} {
		if r := offline(t, "", tc.args...); !strings.Contains(r.errOut, tc.want) {
			t.Errorf("%v: no %q:\n%s", tc.args, tc.want, r.errOut)
		}
	}
}

// TestPrinterIsTheOnlyPlaceFormatsDiffer: no command compares output format
// names; the printer does.
func TestPrinterIsTheOnlyPlaceFormatsDiffer(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	compare := regexp.MustCompile(`(==|!=)\s*"(text|wide|json|yaml|junit)"|case\s+"(text|wide|json|yaml|junit)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "output.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range compare.FindAllString(string(b), -1) {
			t.Errorf("%s compares a format name: %s", f, m)
		}
	}
}

// TestPrinterJSON: -o json is protobuf JSON — 64-bit integers as strings —
// for messages and for verdictctl's own values alike.
func TestPrinterJSON(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	var o outputFlag
	fs := newFlags("t", &env{stderr: &buf, stdout: &buf})
	o.register(fs, "text", "json", "yaml")
	if err := fs.Parse([]string{"-o", "json"}); err != nil {
		t.Fatal(err)
	}
	p := o.printer(&buf)
	for _, tc := range []struct {
		v    any
		want string
	}{
		{&verdictv1.DecideResponse{Revision: 42}, `"revision": "42"`},
		{diffReport{Revision: 7}, `"revision": "7"`},
		{&verdictv1.DecisionRecord{Revision: 3, LatencyNs: 1500, Caller: &verdictv1.RecordCaller{Address: "127.0.0.1:5"}}, `"latencyNs": "1500"`},
	} {
		buf.Reset()
		if err := p.print(tc.v, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), tc.want) || !json.Valid(buf.Bytes()) {
			t.Errorf("%T: %s, want %s", tc.v, buf.String(), tc.want)
		}
	}
}

// TestLogsHintAndHeader: the hint for followers of records the daemon never
// logs, and the header the daemon names its filter in.
func TestLogsHintAndHeader(t *testing.T) {
	t.Parallel()
	if logFilterHeader != decisionlog.FilterHeader {
		t.Errorf("verdictctl reads %q, the daemon sends %q", logFilterHeader, decisionlog.FilterHeader)
	}
	for _, tc := range []struct {
		filter []string
		req    *verdictv1.FollowRequest
		want   string
	}{
		{[]string{"denies"}, &verdictv1.FollowRequest{AuditOnly: true}, "logs denied decisions only"},
		{[]string{"denies"}, &verdictv1.FollowRequest{Action: "ALLOW"}, "no ALLOW record will come"},
		{[]string{"all"}, &verdictv1.FollowRequest{AuditOnly: true}, ""},
		{nil, &verdictv1.FollowRequest{AuditOnly: true}, ""},
	} {
		var buf bytes.Buffer
		logsHint(&buf, tc.filter, tc.req)
		if (tc.want == "") != (buf.Len() == 0) || !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%v %v: %q, want %q", tc.filter, tc.req, buf.String(), tc.want)
		}
	}
}

// TestFmt: on every YAML file of the repository, fmt changes no value a
// decoder reads, keeps every comment, and is stable (a second run changes
// nothing); the examples are formatted already (make test runs fmt --check
// examples/).
func TestFmt(t *testing.T) {
	t.Parallel()
	var files []string
	for _, g := range []string{"../../examples/*.yaml", "../../examples/*/*.yaml", "../../testdata/*.yaml", "../../testdata/conformance/*.yaml"} {
		m, _ := filepath.Glob(g)
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("only %d files", len(files))
	}
	comment := regexp.MustCompile(`(?m)(^|\s)#.*$`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := formatYAML(data)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		a, errA := resource.ParseYAML(data)
		b, errB := resource.ParseYAML(out)
		if errA != nil || errB != nil || len(a) != len(b) {
			t.Errorf("%s: %v %v, %d and %d documents", f, errA, errB, len(a), len(b))
			continue
		}
		for i := range a {
			if !reflect.DeepEqual(a[i].Value, b[i].Value) {
				t.Errorf("%s: document %d reads differently after fmt:\n%s", f, i, out)
			}
		}
		before, after := comment.FindAllString(string(data), -1), comment.FindAllString(string(out), -1)
		if len(before) != len(after) {
			t.Errorf("%s: %d comments before fmt, %d after", f, len(before), len(after))
		}
		if again, err := formatYAML(out); err != nil || !bytes.Equal(again, out) {
			t.Errorf("%s: a second fmt changes the output (%v)", f, err)
		}
	}
	if r := (ctl{}).run(t, "", "fmt", "--check", "../../examples/"); r.code != 0 {
		t.Errorf("fmt --check examples/: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	// What fmt changes, and only that (docs/cli.md, "fmt").
	for _, tc := range []struct{ name, in, want string }{
		{"comments, key order and blank lines kept",
			"# head\nname: p   # aligned\nkind: Policy\n\n# before sources\nsources: [{}]\ndestinations: [{}]\n",
			"# head\nname: p   # aligned\nkind: Policy\n\n# before sources\nsources: [{}]\ndestinations: [{}]\n"},
		{"indentation", "kind: Workload\nname: w\ntags:\n    app: web\naddresses:\n- 10.0.0.1\n- 10.0.0.2\n",
			"kind: Workload\nname: w\ntags:\n  app: web\naddresses: [10.0.0.1, 10.0.0.2]\n"},
		{"quotes only where needed, as written", "name: \"p\"\nport: \"8080\"\nany: '*'\nprincipal: 'spiffe://a/b'\n",
			"name: p\nport: \"8080\"\nany: '*'\nprincipal: spiffe://a/b\n"},
		{"a Kuma document stays Kuma", "type: MeshTrafficPermission\nname: p\nmesh: default\nspec:\n  targetRef: {kind: Mesh}\n  from:\n  - targetRef: {kind: Mesh}\n    default: {action: Allow}\n",
			"type: MeshTrafficPermission\nname: p\nmesh: default\nspec:\n  targetRef: {kind: Mesh}\n  from:\n    - targetRef: {kind: Mesh}\n      default: {action: Allow}\n"},
		{"a wrapped flow collection becomes a block", "tags: {app: web,\n  env: prod}\n", "tags:\n  app: web\n  env: prod\n"},
		{"document order and separators", "---\nkind: Mesh\nname: b\n---\nkind: Mesh\nname: a\n", "---\nkind: Mesh\nname: b\n---\nkind: Mesh\nname: a\n"},
		{"a separator after the first comment", "# meshes\n---\nkind: Mesh\nname: b\n", "# meshes\n---\nkind: Mesh\nname: b\n"},
		{"a literal block", "kind: Policy\nconf:\n  script: |\n    one\n    two\n", "kind: Policy\nconf:\n  script: |\n    one\n    two\n"},
	} {
		out, err := formatYAML([]byte(tc.in))
		if err != nil || string(out) != tc.want {
			t.Errorf("%s: %v\n%s\nwant\n%s", tc.name, err, out, tc.want)
		}
	}
}

// TestProblemsHaveLines: every docpos.Problem of every document, and of a suite
// file that does not load, is named file:line:column with its path, sorted
// by position.
func TestProblemsHaveLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	docs := filepath.Join(dir, "docs.yaml")
	if err := os.WriteFile(docs, []byte("kind: Policy\nname: p\nsources: [{mach: {app: web}}]\ndestination: [{}]\naction: MAYBE\n---\nkind: Scope\nname: s\nselectors: [{}]\nprioriy: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	suite := filepath.Join(dir, "suite.yaml")
	if err := os.WriteFile(suite, []byte("name: s\nresources:\n  - {kind: Policy, name: p, sources: [{}]}\n  - {kind: Mesh, name: default, tieBreak: Coin}\ncases:\n  - name: a\n    decide: {port: x}\n  - name: b\n    frobnicate: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := offline(t, "", "validate", docs)
	want := []string{
		docs + ":3:12: documents[0].sources[0].mach: unknown field; did you mean match?",
		docs + ":4:1: documents[0].destination: unknown field; did you mean destinations?",
		docs + ":5:1: documents[0].action: \"MAYBE\" is not ALLOW or DENY",
		docs + ":10:1: documents[1].prioriy: unknown field; did you mean priority?",
	}
	if r.code != exitFailed || !strings.Contains(r.errOut, strings.Join(want, "\n  ")) {
		t.Errorf("validate: exit %d\n%s\nwant, in this order:\n%s", r.code, r.errOut, strings.Join(want, "\n"))
	}
	r = offline(t, "", "test", suite)
	for _, w := range []string{suite + ":3:5: resources[0]", suite + ":4:33: resources[1].tieBreak", suite + ":6:5: cases[0]", suite + ":8:5: cases[1]",
		"(1 file did not load)"} {
		if !strings.Contains(r.out, w) {
			t.Errorf("test: no %q in\n%s", w, r.out)
		}
	}
	if r.code != exitError {
		t.Errorf("test of a suite that does not load: exit %d", r.code)
	}
}

// TestProgress: a line on stderr rewritten in place, shown only to a person
// at a terminal reading text.
func TestProgress(t *testing.T) {
	t.Parallel()
	var errb bytes.Buffer
	e := &env{stderr: &errb, terminal: true}
	text := &printer{format: "text"}
	if newProgress(&env{stderr: &errb}, text, "x", 1) != nil || newProgress(e, &printer{format: "json"}, "x", 1) != nil {
		t.Error("progress shown without a terminal, or with -o json")
	}
	p := newProgress(e, text, "apply", 300)
	p.show(0, "call 1 of 3")
	p.clear()
	p.show(128, "call 2 of 3")
	p.done()
	if got := errb.String(); !strings.Contains(got, "\rapply: 0/300, call 1 of 3") || !strings.HasSuffix(got, "\r") {
		t.Errorf("progress wrote %q", got)
	}
	var nilProgress *progress
	nilProgress.show(1, "")
	nilProgress.done()
}

// TestWorking: one long call shows the time waited and what arrived, after
// half a second, and erases the line when it ends; nothing without a person.
func TestWorking(t *testing.T) {
	t.Parallel()
	var quiet bytes.Buffer
	note, stop := working(&env{stderr: &quiet}, &printer{format: "text"}, "lint")
	note("3 pairs")
	stop()
	if quiet.Len() != 0 {
		t.Errorf("shown without a terminal: %q", quiet.String())
	}
	var errb syncBuffer
	note, stop = working(&env{stderr: &errb, terminal: true}, &printer{format: "text"}, "matrix")
	note("3,000 pairs")
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(errb.String(), " s, 3,000 pairs") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	got := errb.String()
	if !strings.Contains(got, "\rmatrix: ") || !strings.Contains(got, " s, 3,000 pairs") || !strings.HasSuffix(got, "\r") {
		t.Errorf("working wrote %q", got)
	}
}

// TestUnifiedDiff: hunks with three lines of context, a removal before the
// line that replaces it, line numbers from 1.
func TestUnifiedDiff(t *testing.T) {
	t.Parallel()
	a := "a\nb\nc\nd\ne\nf\ng\nh\n"
	b := "a\nb\nc\nd\nE\nf\ng\nh\ni\n"
	var buf bytes.Buffer
	unifiedDiff(&buf, "x", "y", a, b)
	want := "--- x\n+++ y\n@@ -2,7 +2,8 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n+i\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}
	buf.Reset()
	unifiedDiff(&buf, "/dev/null", "y", "", "a\nb\n")
	if want := "--- /dev/null\n+++ y\n@@ -0,0 +1,2 @@\n+a\n+b\n"; buf.String() != want {
		t.Errorf("a created document:\n%s\nwant\n%s", buf.String(), want)
	}
}

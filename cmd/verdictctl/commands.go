package main

// The command table: every command's name, synopsis, help and examples in
// one place. The top-level help, each command's --help, `verdictctl help
// COMMAND`, the "did you mean" of a mistyped command and the completion
// scripts are all read from it.

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// command is one verdictctl command.
type command struct {
	name     string
	group    string   // the heading it is listed under
	args     string   // the synopsis after the name
	summary  string   // one line in the command list
	about    string   // the help's paragraph
	examples []string // shell lines, shown in the help
	offline  bool     // needs no server (no connection flags)
	run      func(ctx context.Context, args []string, e *env) int
}

// groups orders the headings of the top-level help.
var groups = []string{"Resources", "Decisions", "Analysis", "Offline", "Other"}

// commands returns the table (a function: the commands' run functions read
// it for their help, which would make a package-level table a cycle).
func commands() []*command {
	return []*command{
		{name: "apply", group: "Resources", args: "-f FILE|DIR|- [--dry-run]",
			summary: "write resources (native or Kuma YAML/JSON); unchanged ones are not written",
			about: "Validates and writes resources. Each document is reported created, configured or\n" +
				"unchanged; an unchanged document is not written, and a call that changes nothing writes\n" +
				"nothing. A set larger than one etcd transaction (128 resources) is checked whole, then\n" +
				"written in several calls in dependency order, each atomic; if one fails, the calls before\n" +
				"it are rolled back (docs/cli.md, \"Large applies\").",
			examples: []string{"verdictctl apply -f examples/policies.yaml", "verdictctl apply -f examples/ --dry-run",
				"kumactl get meshtrafficpermissions -o yaml | verdictctl apply -f -"},
			run: runApply},
		{name: "diff", group: "Resources", args: "-f FILE|DIR|- | --from-revision A [--to-revision B] [--prefix P]",
			summary: "what apply -f would change, or what changed between two revisions: exit 0 none, 1 some",
			about: "Compares the documents with what the server holds and prints a unified diff per\n" +
				"document that would change (a created one against nothing). Exit code 0 when applying them\n" +
				"would change nothing, 1 when it would change something. With --from-revision A (and\n" +
				"--to-revision B, default now) it compares the store at two revisions instead: a diff per\n" +
				"resource added, changed or deleted, then the workload pairs whose answer differs, before\n" +
				"and after (docs/history.md); exit 0 when none, 1 when some.",
			examples: []string{"verdictctl diff -f examples/policies.yaml", "verdictctl diff -f policies/ && echo in sync",
				"verdictctl diff --from-revision 120 --to-revision 135 --prefix default/"},
			run: runDiff},
		{name: "get", group: "Resources", args: "KEY | KIND NAME",
			summary: "show one resource (KIND: mesh, scope, policy, workload)",
			about: "Shows one resource from the server's snapshot, valid or not, as YAML (re-appliable; the\n" +
				"key, revisions and any error as comments) or JSON. --at-revision N or --at TIME shows it as\n" +
				"it was then (docs/history.md).",
			examples: []string{"verdictctl get policy web-to-backend", "verdictctl get default/policies/TrafficLog/log-all -o json",
				"verdictctl get scope Apps --mesh payments"},
			run: runGet},
		{name: "list", group: "Resources", args: "[PREFIX]",
			summary: "list resources, valid or not (-o wide: kind, type, mode, action, scope, age)",
			about: "Lists resources in key order, valid or not (PREFIX: \"default/\",\n" +
				"\"default/policies/TrafficLog/\"). -o yaml prints every document, re-appliable.",
			examples: []string{"verdictctl list", "verdictctl list -o wide --mesh payments", "verdictctl list default/policies/TrafficLog/ -o yaml > backup.yaml"},
			run:      runList},
		{name: "delete", group: "Resources", args: "KEY... | KIND NAME | -f FILE | --prefix P [--strict]",
			summary: "remove resources",
			about: "Removes resources: policies first, meshes last. A key that holds nothing is reported and\n" +
				"skipped, and the command succeeds (--strict: nothing is deleted then, exit 3). More keys than\n" +
				"one etcd transaction holds are deleted in several calls, rolled back if one fails.",
			examples: []string{"verdictctl delete policy legacy-to-db", "verdictctl delete default/scopes/Apps --dry-run",
				"verdictctl delete -f examples/kuma-traffic-permission.yaml", "verdictctl delete --prefix big/"},
			run: runDelete},
		{name: "history", group: "Resources", args: "KEY | --prefix [PREFIX] [--from-revision A] [--to-revision B]",
			summary: "who changed a key (or a prefix) and when, within the retention window",
			about: "Lists the versions of a key, or of every key under a prefix, written within the retention\n" +
				"window, oldest first: revision, time and writer as verdict recorded them (\"-\" for a write made\n" +
				"around verdict, with etcdctl), and the change. -o wide adds each version's unified diff to\n" +
				"the one before; -o json prints the versions with both documents (docs/history.md).",
			examples: []string{"verdictctl history default/policies/TrafficPermission/web-to-backend -o wide",
				"verdictctl history --prefix default/ --limit 20", "verdictctl history --prefix --from-revision 1200 -o json"},
			run: runHistory},
		{name: "revert", group: "Resources", args: "KEY | --prefix PREFIX --to-revision N [--dry-run]",
			summary: "write back what a key (or a prefix) held at a past revision, as a new revision",
			about: "Writes back the documents a key, or every key under a prefix, held at revision N — creationTime\n" +
				"included — and deletes the keys created since, in one transaction validated as apply is.\n" +
				"Refused (exit 3, ABORTED) when a key changed after the revision read first (or\n" +
				"--expected-revision), so a revert never overwrites a change it did not see (docs/history.md).",
			examples: []string{"verdictctl revert default/policies/TrafficPermission/web-to-backend --to-revision 120",
				"verdictctl revert --prefix default/ --to-revision 120 --dry-run"},
			run: runRevert},
		{name: "status", group: "Resources", args: "",
			summary:  "the server's revision, sync state, invalid resources",
			about:    "Shows the server's snapshot revision, sync state, digest and invalid resources.",
			examples: []string{"verdictctl status", "verdictctl status -o json"},
			run:      runStatus},
		{name: "decide", group: "Decisions", args: "--src k=v,.. --dst k=v,.. [--proto TCP --port 443]",
			summary: "decide a flow (exit 0 ALLOW, 1 DENY)",
			about: "Decides a flow. Exit code 0 when it is allowed, 1 when it is denied. Each end is given in\n" +
				"exactly one form: --src k=v,.. (tags), --src-workload NAME, --src-address IP,\n" +
				"--src-principal ID, --src-identity N or --src-any (likewise --dst-...). --at-revision N or\n" +
				"--at TIME (RFC 3339, or -2h) decides as the policies were then (docs/history.md).",
			examples: []string{"verdictctl decide --src kuma.io/service=web --dst kuma.io/service=backend --proto TCP --port 8080",
				"verdictctl decide --src-workload web-1 --dst-address 10.0.0.7 --proto TCP --port 5432 -o json",
				"verdictctl decide --src kuma.io/service=web --dst kuma.io/service=db --at 2026-11-21T14:00:00Z"},
			run: runDecide},
		{name: "explain", group: "Decisions", args: "--src k=v,.. --dst k=v,.. [--proto TCP --port 443]",
			summary: "decide and show the candidates of each side",
			about: "Decides a flow and shows, per side, the candidate rules in order, which matched,\n" +
				"which decided and why the others did not, then the policies that were not candidates.\n" +
				"Exit code 0 when the flow is allowed, 1 when it is denied.",
			examples: []string{"verdictctl explain --src kuma.io/service=web --dst kuma.io/service=db --proto TCP --port 5432"},
			run:      runExplain},
		{name: "resolve", group: "Decisions", args: "--type T --dst k=v,.. [--src k=v,..]",
			summary: "effective configuration of a type",
			about: "Shows the effective configuration of a type for a flow, or for one workload (one end\n" +
				"alone): each rule with the policy it came from, and each policy's status.",
			examples: []string{"verdictctl resolve --type TrafficLog --src kuma.io/service=backend --dst kuma.io/service=db,env=prod"},
			run:      runResolve},
		{name: "watch", group: "Decisions", args: "[resources|rules] [flags]",
			summary: "follow changes (rules: of one --workload)",
			about: "resources (default): prints the store's snapshot, a SYNCED line, then every change with its\n" +
				"revision (--from-revision resumes). rules: prints the ordered rules of one --workload,\n" +
				"again whenever they change. Stops on Ctrl-C.",
			examples: []string{"verdictctl watch", "verdictctl watch rules --workload kuma.io/service=db", "verdictctl watch --prefix default/policies/ -o json"},
			run:      runWatch},
		{name: "inspect", group: "Decisions", args: "--workload k=v,.. | --workload-name NAME | --workload-address IP [--type T]...",
			summary: "a workload's scopes, ordered rules and effective configuration",
			about: "Shows a workload's member scopes, its inbound and outbound rules in decision order for each\n" +
				"--type (default TrafficPermission), and each type's effective configuration.",
			examples: []string{"verdictctl inspect --workload kuma.io/service=backend", "verdictctl inspect --workload-name cart-1 --type TrafficPermission --type TrafficLog"},
			run:      runInspect},
		{name: "logs", group: "Decisions", args: "[--action DENY] [--policy P] [--workload W]",
			summary: "follow the decision log of the server, live",
			about: "Follows the decision records of the replica at --server, from now on, until Ctrl-C: one line\n" +
				"per decision (-o json: one record per line, the protobuf JSON of DecisionRecord). Needs an\n" +
				"authorized caller and the daemon's decision log on (--decision-log). A follower that falls\n" +
				"behind is ended by the server; verdictctl reconnects and says so (the records in between\n" +
				"are not replayed).",
			examples: []string{"verdictctl logs --action DENY", "verdictctl logs --workload web --mesh payments -o json", "verdictctl logs --audit-only"},
			run:      runLogs},
		{name: "reach", group: "Analysis", args: "--dst-workload NAME | --src-workload NAME [--proto TCP --port 5432]",
			summary: "who can reach an endpoint (--dst-…), or what it can reach (--src-…)",
			about: "Lists the peers an endpoint is allowed with, exactly as Decide answers each flow: the\n" +
				"inventory's workloads, then what is allowed outside it (any address, CIDR blocks, principal\n" +
				"patterns), each with the deciding policy of both sides (docs/analysis.md). Give one end, in\n" +
				"any form decide takes: --dst-… for who can reach it, --src-… for what it can reach (both:\n" +
				"exit 2). Exit code 0 on any answer.",
			examples: []string{"verdictctl reach --dst-workload db-1 --proto TCP --port 5432",
				"verdictctl reach --src-workload web-1 --proto TCP --port 8080 -o json"},
			run: runReach},
		{name: "matrix", group: "Analysis", args: "[--src k=v,..] [--dst k=v,..] [--proto TCP [--port 443]]",
			summary: "the allowed pairs among workloads, per class of ports",
			about: "Lists every allowed (source, destination) pair of workloads, per protocol and range of\n" +
				"ports the policies tell apart (docs/analysis.md). --src and --dst select workloads by tags.",
			examples: []string{"verdictctl matrix --src app=web", "verdictctl matrix --proto TCP --port 5432 -o json"},
			run:      runMatrix},
		{name: "impact", group: "Analysis", args: "-f FILE|DIR [--delete KEY] [--flows FILE] [--fail-on any|deny|allow]",
			summary: "the flows a change would alter, before it is applied (exit 0 none, 1 some)",
			about: "Judges a change without writing it: validated as apply's dry run, then every workload pair\n" +
				"on every class of ports, and the flows the replicas observed (and --flows: decision-log JSON\n" +
				"lines), decided before and after. Prints each changed flow (before -> after, deciding\n" +
				"policy) and a count per policy, destination and ports. Exit code 0 when no flow changes, 1\n" +
				"when one does (--fail-on deny: only a newly denied flow; allow: only a newly allowed one).",
			examples: []string{"verdictctl impact -f change.yaml", "verdictctl impact --delete default/policies/TrafficPermission/old --fail-on deny",
				"verdictctl impact -f policies/ --flows decisions.jsonl -o json"},
			run: runImpact},
		{name: "lint", group: "Analysis", args: "[--mesh M] [--type T] [-f FILE|DIR]",
			summary: "shadowed, redundant, tied and dead rules, overlapping scopes (exit 1 on an error)",
			about: "Finds the rules that can never decide a flow (shadowed: error), the rules whose removal\n" +
				"changes no answer (redundant), rules of one rank with opposite actions ordered only by the\n" +
				"tie-break, overlapping sibling scopes (warnings), policies that select no workload and audit\n" +
				"policies that never change an answer (info) — each with a witness flow that Decide confirms,\n" +
				"judged over every tag set, not only the inventory (docs/lint.md). -f lints documents offline.\n" +
				"Exit code 1 when an error-level finding exists, else 0.",
			examples: []string{"verdictctl lint", "verdictctl lint --mesh payments -o json", "verdictctl lint -f policies/"},
			run:      runLint},
		{name: "test", group: "Offline", args: "FILE|DIR...", offline: true,
			summary: "run policy test suites (docs/suites.md)",
			about: "Runs policy test suites offline on the engine (docs/suites.md): no server. Exit code 0 when\n" +
				"every case passed, 1 when a case failed, 3 when a file did not load.",
			examples: []string{"verdictctl test testdata/conformance/kuma_sd.yaml", "verdictctl test testdata/ -v --run 'kuma/.*deny'", "verdictctl test testdata/ -o junit > report.xml"},
			run:      offlineRun(runTest)},
		{name: "validate", group: "Offline", args: "FILE|DIR|-...", offline: true,
			summary: "check documents with the server's decoder",
			about: "Checks documents offline with the server's decoder: every field of every document. --whole\n" +
				"also checks the set as a store of its own: references between its resources, conflicts (a\n" +
				"reference to a resource only the server holds then fails). Exit code 0 when every document\n" +
				"is valid, 1 when one is not.",
			examples: []string{"verdictctl validate examples/", "verdictctl validate --whole policies/"},
			run:      offlineRun(runValidate)},
		{name: "fmt", group: "Offline", args: "FILE|DIR|-... [-w | --check]", offline: true,
			summary: "lay documents out in one style, comments and order kept",
			about: "Rewrites documents' layout only: indentation, quoting and list style (docs/cli.md, \"fmt\").\n" +
				"Comments, document order, each document's form (a Kuma document stays Kuma) and key order\n" +
				"are kept. -w rewrites the files; --check lists the files that would change and exits 1.",
			examples: []string{"verdictctl fmt policies.yaml", "verdictctl fmt -w examples/", "verdictctl fmt --check examples/"},
			run:      offlineRun(runFmt)},
		{name: "version", group: "Other", args: "[--client]",
			summary:  "the client's and the server's versions (warns when they differ)",
			about:    "Prints verdictctl's version and the server's; warns on stderr when they differ.",
			examples: []string{"verdictctl version", "verdictctl version --client -o json"},
			run:      runVersion},
		{name: "completion", group: "Other", args: "bash|zsh|fish", offline: true,
			summary:  "a shell completion script",
			about:    "Prints a completion script for the shell: commands, and each command's flags.",
			examples: []string{"source <(verdictctl completion bash)", "source <(verdictctl completion zsh)", "verdictctl completion fish | source"},
			run:      offlineRun(runCompletion)},
		{name: "help", group: "Other", args: "[COMMAND]", offline: true,
			summary:  "this list, or a command's help with examples",
			about:    "Prints the commands, or one command's help: its flags and examples.",
			examples: []string{"verdictctl help apply"},
			run:      offlineRun(runHelp)},
	}
}

func offlineRun(f func(args []string, e *env) int) func(context.Context, []string, *env) int {
	return func(_ context.Context, args []string, e *env) int { return f(args, e) }
}

// lookup finds a command by name.
func lookup(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// topUsage is the top-level help.
func topUsage(w io.Writer) {
	fmt.Fprint(w, "verdictctl — verdict's command-line client (docs/cli.md)\n\nUsage:\n  verdictctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n")
	cmds := commands()
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		for _, c := range cmds {
			if c.group == g {
				fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
			}
		}
	}
	fmt.Fprint(w, `
Keys are "<mesh>/mesh", "<mesh>/scopes/<name>", "<mesh>/policies/<type>/<name>" or
"<mesh>/workloads/<name>".
Global flags (before or after the command): --server (VERDICT_SERVER, default 127.0.0.1:7070),
--token-file (VERDICT_TOKEN_FILE, or the token itself in VERDICT_TOKEN), --tls-ca, --tls-cert,
--tls-key, --tls-server-name, --timeout, -o/--output text|wide|json|yaml.
Exit codes: 0 yes or done, 1 the answer is no (denied, a difference, invalid documents in
validate, a failed test), 2 usage (an unknown command, flag or value; found before any call),
3 a server or I/O error.

Run 'verdictctl help COMMAND' (or 'verdictctl COMMAND --help') for a command's flags and examples.
`)
}

// runHelp is `verdictctl help [COMMAND]`.
func runHelp(args []string, e *env) int {
	switch {
	case len(args) == 0:
		topUsage(e.stdout)
		return exitOK
	case len(args) > 1:
		return usageError(e, "help", "give at most one command")
	}
	c := lookup(args[0])
	if c == nil {
		return unknownCommand(e, args[0])
	}
	if c.name == "help" {
		topUsage(e.stdout)
		return exitOK
	}
	return runEnv(context.Background(), []string{c.name, "--help"}, e)
}

// unknownCommand is the error of a mistyped command, with the nearest ones.
func unknownCommand(e *env, name string) int {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	fmt.Fprintf(e.stderr, "verdictctl: unknown command %q\n", name)
	if s := suggest(name, names); len(s) > 0 {
		fmt.Fprintf(e.stderr, "Did you mean %s?\n", strings.Join(s, " or "))
	}
	fmt.Fprintln(e.stderr, "Run 'verdictctl help' for the commands.")
	return exitUsage
}

// usageError prints a short usage error and the hint line, and returns
// exitUsage.
func usageError(e *env, cmd, msg string) int {
	fmt.Fprintf(e.stderr, "verdictctl %s: %s\n", cmd, msg)
	fmt.Fprintf(e.stderr, "Run 'verdictctl %s --help' for usage.\n", cmd)
	return exitUsage
}

// suggest returns the candidates nearest to s: within an edit distance of a
// third of its length (at least 1, at most 3), or having it as a prefix.
func suggest(s string, candidates []string) []string {
	limit := min(max(len(s)/3, 1), 3)
	best := limit + 1
	var out []string
	for _, c := range candidates {
		d := distance(strings.ToLower(s), strings.ToLower(c))
		if len(s) >= 3 && strings.HasPrefix(c, s) {
			d = min(d, 1)
		}
		switch {
		case d < best:
			best, out = d, []string{c}
		case d == best:
			out = append(out, c)
		}
	}
	if best > limit {
		return nil
	}
	return out
}

// distance is the Damerau-Levenshtein distance (restricted: adjacent
// transpositions count one), over bytes.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

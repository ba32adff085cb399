package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes a shell user can rely on.
const (
	exitOK     = 0
	exitFailed = 1 // the command ran and the answer is "no": a denied flow, a failed test
	exitUsage  = 2 // bad flags or arguments
	exitError  = 3 // the command could not do its job: server unreachable, invalid input, not found
)

const usage = `verdictctl — verdict's command-line client (docs/cli.md)

Usage:
  verdictctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]

Resources:
  apply -f FILE|DIR|- [--dry-run]          write resources (native or Kuma YAML/JSON); large sets are
                                           checked whole, written in order, rolled back on failure
  get KEY | KIND NAME                      show one resource (KIND: mesh, scope, policy, workload)
  list [PREFIX]                            list resources, valid or not (-o wide: kind, type, action, scope, age)
  delete KEY... | KIND NAME | -f FILE | --prefix P [--strict]
                                           remove resources
  status                                   the server's revision, sync state, invalid resources
Decisions:
  decide --src k=v,.. --dst k=v,.. [--proto TCP --port 443]
                                           decide a flow (exit 0 ALLOW, 1 DENY); an end may also be
                                           --src-workload, --src-address, --src-principal, --src-identity
                                           or --src-any (likewise --dst-...)
  explain --src k=v,.. --dst k=v,..        decide and show the candidates of each side
  resolve --dst k=v,.. [--src k=v,..]      effective configuration of a type
  watch [resources|rules]                  follow changes (rules: of one --workload)
  inspect --workload k=v,.. [--type T]...  a workload's scopes, ordered rules and effective configuration
  logs [--action DENY] [--policy P] [--workload W]
                                           follow the decision log of the server, live
Other:
  version [--client]                       the client's and the server's versions (warns when they differ)
  completion bash|zsh|fish                 a shell completion script
Offline:
  test FILE|DIR...                         run policy test suites (docs/suites.md)
  validate FILE|DIR|-...                   check documents with the server's decoder
  fmt FILE|DIR|-...                        print documents in canonical form (-w, --check)

Keys are "<mesh>/mesh", "<mesh>/scopes/<name>", "<mesh>/policies/<type>/<name>" or
"<mesh>/workloads/<name>".
Global flags (before or after the command): --server (VERDICT_SERVER, default 127.0.0.1:7070),
--token-file (VERDICT_TOKEN_FILE, or the token itself in VERDICT_TOKEN), --tls-ca, --tls-cert,
--tls-key, --tls-server-name, --timeout, -o text|wide|json|yaml.
Exit codes: 0 success, 1 the answer is no (DENY, failed tests), 2 usage, 3 error.
Run 'verdictctl COMMAND -h' for a command's flags.
`

// env lets tests replace the environment.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	maxOps         int            // keys per write call; 0: store.MaxOps (tests set less)
	beforeCall     func(call int) // tests: runs before each write call of apply and delete
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, &env{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv})
}

func runEnv(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return exitUsage
	}
	cmds := map[string]func(context.Context, []string, *env) int{
		"apply": runApply, "get": runGet, "list": runList, "delete": runDelete, "status": runStatus,
		"decide": runDecide, "explain": runExplain, "resolve": runResolve, "watch": runWatch, "logs": runLogs, "version": runVersion, "inspect": runInspect,
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(e.stdout, usage)
		return exitOK
	}
	args, err := hoistGlobals(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl: %v\n\n%s", err, usage)
		return exitUsage
	}
	switch args[0] {
	case "test":
		return runTest(args[1:], e)
	case "validate":
		return runValidate(args[1:], e)
	case "fmt":
		return runFmt(args[1:], e)
	case "completion":
		return runCompletion(args[1:], e)
	}
	if f, ok := cmds[args[0]]; ok {
		return f(ctx, args[1:], e)
	}
	fmt.Fprintf(e.stderr, "verdictctl: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// globalFlags may come before the command: verdictctl --server H:P apply ...
var globalFlags = map[string]bool{"server": true, "token-file": true, "tls-ca": true, "tls-cert": true, "tls-key": true,
	"tls-server-name": true, "timeout": true, "o": true, "output": true}

// hoistGlobals moves the global flags given before the command after it,
// where the command's flag set reads them.
func hoistGlobals(args []string) ([]string, error) {
	var pre []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if !globalFlags[name] {
			return nil, fmt.Errorf("%s is not a global flag (global: --server, --token-file, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --timeout, -o); give it after the command", args[0])
		}
		pre, args = append(pre, args[0]), args[1:]
		if !hasValue {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s needs a value", pre[len(pre)-1])
			}
			pre, args = append(pre, args[0]), args[1:]
		}
	}
	if len(args) == 0 {
		return nil, errors.New("no command")
	}
	return append(append([]string{args[0]}, pre...), args[1:]...), nil
}

// parse parses flags anywhere among the arguments and returns the others;
// the exit code is non-zero when the command must stop.
func parse(fs *flag.FlagSet, args []string) ([]string, int) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitOK + 100 // help printed: stop with 0
			}
			return nil, exitUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, 0
		}
		if args[0] == "--" {
			return append(rest, args[1:]...), 0
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// stopCode turns parse's code into the command's exit code.
func stopCode(code int) int {
	if code == exitOK+100 {
		return exitOK
	}
	return code
}

// fail prints an error (a gRPC status with its field violations) and returns
// exitError. fields maps "resources[i]" prefixes to where they came from.
func fail(e *env, cmd string, err error, origin func(field string) string) int {
	st, ok := status.FromError(err)
	if !ok {
		var ve *resource.ValidationError
		if errors.As(err, &ve) {
			fmt.Fprintf(e.stderr, "verdictctl %s: invalid:\n", cmd)
			for _, fe := range ve.Errors {
				fmt.Fprintf(e.stderr, "  %s\n", fe.Error())
			}
			return exitError
		}
		fmt.Fprintf(e.stderr, "verdictctl %s: %v\n", cmd, err)
		return exitError
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		msg += " (is verdictd running at the --server address?)"
	case codes.Unauthenticated:
		msg += " (give a token with --token-file or VERDICT_TOKEN, or a client certificate)"
	}
	var violations []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			violations = append(violations, br.GetFieldViolations()...)
		}
	}
	if len(violations) == 0 {
		fmt.Fprintf(e.stderr, "verdictctl %s: %s: %s\n", cmd, st.Code(), msg)
		return exitError
	}
	fmt.Fprintf(e.stderr, "verdictctl %s: %s:\n", cmd, st.Code())
	for _, v := range violations {
		field := v.GetField()
		if origin != nil {
			field = origin(field)
		}
		fmt.Fprintf(e.stderr, "  %s: %s\n", field, v.GetDescription())
	}
	return exitError
}

// parseTags reads "k=v,k2=v2".
func parseTags(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", part)
		}
		out[k] = v
	}
	return out, nil
}

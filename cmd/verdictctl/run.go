package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/docpos"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes a shell user can rely on (docs/cli.md, "Exit codes").
const (
	exitOK     = 0
	exitFailed = 1 // the answer is no: a denied flow, a difference, invalid documents in validate, a failed test
	exitUsage  = 2 // an unknown command, flag or value, found before any call
	exitError  = 3 // a server or I/O error: unreachable, refused, not found, a file that cannot be read
)

// env lets tests replace the environment.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	maxOps         int            // keys per write call; 0: store.MaxOps (tests set less)
	beforeCall     func(call int) // tests: runs before each write call of apply and delete
	// terminal: stderr is a terminal a person watches (progress is shown).
	terminal bool
	// onFlags, when set, receives each command's flag set instead of running
	// the command (the completion scripts list the flags this way).
	onFlags func(fs *flagSet)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, &env{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv,
		terminal: isTerminal(os.Stdout) && isTerminal(os.Stderr)})
}

func runEnv(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		topUsage(e.stderr)
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" {
		topUsage(e.stdout)
		return exitOK
	}
	args, err := hoistGlobals(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl: %v\nRun 'verdictctl help' for usage.\n", err)
		return exitUsage
	}
	c := lookup(args[0])
	if c == nil {
		return unknownCommand(e, args[0])
	}
	return c.run(ctx, args[1:], e)
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

// fail prints an error — a gRPC status with its field violations, a
// validation error, an I/O error — and returns exitError. at maps the field
// paths of a write's violations to where they came from (nil: as they are).
func fail(e *env, cmd string, err error, at func(field string) docpos.Problem) int {
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
	var ps docpos.Problems
	for _, v := range violations {
		p := docpos.Problem{Path: v.GetField(), Msg: v.GetDescription()}
		if at != nil {
			p = at(v.GetField())
			p.Msg = v.GetDescription()
		}
		ps = append(ps, p)
	}
	ps.Print(e.stderr, "  ")
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

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/verdictpdp/verdict/policytest"
)

// Exit codes a shell user can rely on.
const (
	exitOK     = 0
	exitFailed = 1 // the command ran and the answer is "no": a failed test, a denied flow
	exitUsage  = 2 // bad flags or arguments
	exitError  = 3 // the command could not do its job: server unreachable, invalid input
)

const usage = `verdictctl — verdict's command-line client

Usage:
  verdictctl test FILE...      run policy test suites offline (SPEC section 9)

Run 'verdictctl COMMAND -h' for a command's flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "test":
		return runTest(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "verdictctl: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

func runTest(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "verdictctl test: name at least one suite file")
		return exitUsage
	}
	if !policytest.RunFiles(stdout, args).OK() {
		return exitFailed
	}
	return exitOK
}

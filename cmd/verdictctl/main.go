// Command verdictctl is verdict's command-line client: apply, get, list, delete,
// decide, explain, resolve, watch, and test (policy suites, offline).
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

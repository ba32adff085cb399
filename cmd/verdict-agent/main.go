// Command verdict-agent is verdict's firewall agent: it follows WatchRules
// for the workloads it guards and enforces their rules in an nftables table
// of its own (docs/agent.md). The logic is internal/agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/verdictpdp/verdict/internal/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run: exit 0 after a clean stop, 1 when the agent failed, 2 for a
// configuration it refuses.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	cfg, err := agent.ParseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "verdict-agent: %v\n", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "verdict-agent: invalid configuration:\n%v\n", err)
		return 2
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if err := agent.Run(ctx, cfg, log); err != nil {
		log.Error("verdict-agent failed", "err", err)
		return 1
	}
	return 0
}

// Command spillway is the operator and the drainer of Spillway, one binary
// with a subcommand per role.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spillway-io/spillway/commands"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

var subcommands = map[string]func(ctx context.Context, args []string) error{
	"manager": commands.ManagerCommand,
	"drain":   commands.DrainCommand,
	"migrate": commands.MigrateCommand,
	// The triage of poisoned rows without Kubernetes: list, replay, park.
	"poisoned": commands.PoisonedCommand,
	"version": func(context.Context, []string) error {
		goVersion := "unknown"
		if info, ok := debug.ReadBuildInfo(); ok {
			goVersion = info.GoVersion
		}
		fmt.Printf("spillway %s (%s)\n", version, goVersion)
		return nil
	},
}

func main() {
	if len(os.Args) < 2 || subcommands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: spillway manager|drain|migrate|poisoned|version [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := subcommands[os.Args[1]](ctx, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "spillway %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

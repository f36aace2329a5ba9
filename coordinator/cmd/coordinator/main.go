// Command coordinator is the nodefence coordinator: run three replicas on one etcd (or one with its
// embedded etcd); the elected leader judges nodes and drives fencing through fence-driver services.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/services/buildinfo"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/gctune"
)

func main() {
	ctx, cancel := cli.SignalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// run is the whole program: the configuration and the run are package app's.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg app.Config
	cfg.RegisterFlags(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log as JSON")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.String("coordinator"))
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "coordinator: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	cfg.SetDefaults() // main applies GCPercent itself: the value app.New validates
	log, err := cli.Logger(stderr, *logLevel, *logJSON)
	if err != nil {
		fmt.Fprintln(stderr, "coordinator:", err)
		return 2
	}
	a, err := app.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, "coordinator: refusing to start:")
		for _, e := range cli.Errors(err) {
			fmt.Fprintln(stderr, "  -", e)
		}
		return 2
	}
	gogc, memLimit := gctune.Apply(cfg.GCPercent, gctune.CgroupMemoryMax)
	log.Info("coordinator started", "addr", a.Addr(), "etcd", a.EtcdEndpoint(), "gogc", gogc, "memory_limit_bytes", memLimit)
	if err := a.Run(ctx); err != nil {
		log.Error("coordinator stopped", "err", err)
		return 1
	}
	return 0
}

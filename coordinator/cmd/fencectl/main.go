// Command fencectl is the operator's CLI for the nodefence coordinator: start and watch fences,
// confirm a node off by hand, check a node's fence devices, and look at nodes, zones, the leader and
// the live configuration.
//
//	fencectl COMMAND [ARGS] [flags]      (global flags anywhere on the line)
//	fencectl help [COMMAND]
//
// The commands are the table in commands.go; each has its own flags and help.
package main

import (
	"os"

	"github.com/nodefence/nodefence/services/cli"
)

func main() {
	ctx, cancel := cli.SignalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

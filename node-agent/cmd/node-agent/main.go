// Command node-agent runs on every node and streams its eviction signals, heartbeats and events
// to the nodefence coordinator leader. The program is package nodeagent; see its documentation
// and `node-agent --help`.
package main

import (
	"os"
	"runtime/debug"

	"github.com/nodefence/nodefence/node-agent/nodeagent"
	"github.com/nodefence/nodefence/services/cli"
)

func main() {
	// The agent's live heap is a few MiB: a heap goal of 1.5 times it rather than Go's default 2
	// keeps the agent's RSS near its budget for a GC cost make bench-agent does not see. GOGC in
	// the environment still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	ctx, cancel := cli.SignalContext()
	code := nodeagent.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// Command node-agent runs on every node and streams its eviction signals, heartbeats and events
// to the nodefence coordinator leader. The program is package nodeagent; see its documentation
// and `node-agent --help`.
package main

import (
	"os"

	"github.com/nodefence/nodefence/node-agent/nodeagent"
	"github.com/nodefence/nodefence/services/cli"
)

func main() {
	ctx, cancel := cli.SignalContext()
	code := nodeagent.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// Command fence-driver serves nodefence.driver.v1.FenceDriverService for one fence driver. The
// program is package fencedriver; see its documentation and `fence-driver --help`.
package main

import (
	"os"

	"github.com/nodefence/nodefence/fence-drivers/fencedriver"
	"github.com/nodefence/nodefence/services/cli"
)

func main() {
	ctx, cancel := cli.SignalContext()
	code := fencedriver.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// Command nodefence-testbed runs the whole system on this machine with real peers: an embedded-etcd
// coordinator, the IPMI fence-driver, ipmi_sim BMCs, one real node-agent for this host and a few
// simulated agents (each simulated node has its own BMC).
//
//	nodefence-testbed run    start everything, print how to call it, run until Ctrl-C
//	nodefence-testbed demo   the same, scripted: a node goes silent, is fenced, the BMC is confirmed
//	                         off by ipmitool; prints the timeline and, last, one JSON line; exit 0
//	                         only on success
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodefence-testbed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	exe, _ := os.Executable()
	var opts options
	fs.StringVar(&opts.binDir, "bin", filepath.Dir(exe), "directory with coordinator, fence-driver, node-agent, fencectl")
	fs.StringVar(&opts.workDir, "workdir", "", "working directory for logs and state (default: a new temporary directory)")
	fs.IntVar(&opts.simulated, "simulated", 3, "simulated nodes, each with its own ipmi_sim BMC")
	fs.DurationVar(&opts.grace, "grace", 0, "node-monitor grace period (default 10s for run, 3s for demo)")
	fs.DurationVar(&opts.fenceTimeout, "fence-timeout", 0, "not-ready time before automatic fencing (default 30s for run, 2s for demo)")
	fs.BoolVar(&opts.keep, "keep", false, "keep the working directory after stopping")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: nodefence-testbed [flags] run|demo")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "run" && fs.Arg(0) != "demo") {
		fs.Usage()
		return 2
	}
	var problems []string
	if opts.simulated < 1 || opts.simulated > 20 {
		problems = append(problems, "--simulated: must be between 1 and 20")
	}
	for _, b := range []string{"coordinator", "fence-driver", "node-agent", "fencectl"} {
		if _, err := os.Stat(filepath.Join(opts.binDir, b)); err != nil {
			problems = append(problems, fmt.Sprintf("--bin: %s not found in %s (run `make build`)", b, opts.binDir))
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "nodefence-testbed:", p)
		}
		return 2
	}
	demo := fs.Arg(0) == "demo"
	if opts.grace == 0 {
		opts.grace = 10 * time.Second
		if demo {
			opts.grace = 3 * time.Second
		}
	}
	if opts.fenceTimeout == 0 {
		opts.fenceTimeout = 30 * time.Second
		if demo {
			opts.fenceTimeout = 2 * time.Second
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := startCluster(ctx, opts, stdout, log)
	if c != nil {
		defer c.stop(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "nodefence-testbed:", err)
		return 1
	}
	if demo {
		return runDemo(ctx, c, stdout, stderr)
	}
	c.printHelp(stdout)
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping ...")
	return 0
}

// printHelp tells the user how to talk to the running system.
func (c *cluster) printHelp(w io.Writer) {
	fmt.Fprintf(w, `
nodefence is running (work directory %[1]s):
  coordinator  %[2]s   (embedded etcd, grace period %[3]s, automatic fencing %[11]s after that)
  fence-driver %[4]s   (driver ipmi)
  BMCs         %[5]s
  agents       %[6]s (real node-agent for this host) and %[7]s (simulated)

Everything speaks mutual TLS; you are operator/testbed (certificates in %[12]s):
  TLS="--tls-ca %[13]s --tls-cert %[14]s --tls-key %[15]s"
  GRPCURL="-cacert %[13]s -cert %[14]s -key %[15]s"

Try, in another terminal:
  grpcurl $GRPCURL %[2]s list
  grpcurl $GRPCURL %[2]s nodefence.coordinator.v1.ClusterService/ListNodes
  grpcurl $GRPCURL -d '{"node":"%[8]s","reason":"try it"}' %[2]s nodefence.coordinator.v1.FenceService/Fence
  %[9]s/fencectl $TLS --coordinator %[2]s nodes
  %[9]s/fencectl $TLS --coordinator %[2]s fence %[8]s
  %[9]s/fencectl $TLS --coordinator %[2]s unfence %[8]s
  ipmitool -I lanplus -H 127.0.0.1 -p %[10]d -U admin -P password -C 3 chassis power status
(grpcurl is in %[9]s/tools.) Press Ctrl-C to stop everything.
`, c.dir, c.coordAddr, c.opts.grace, c.driverAddr, strings.Join(c.bmcList(), ", "), c.hostName,
		strings.Join(c.simNames(), ", "), c.sims[0].name, c.opts.binDir, c.sims[0].bmc.Port, c.opts.fenceTimeout,
		c.pki.Dir, c.operator.CAFile, c.operator.CertFile, c.operator.KeyFile)
}

// result is the demo's last line.
type result struct {
	Demo       string  `json:"demo"`
	Node       string  `json:"node"`
	Power      string  `json:"power"`
	VerifiedBy string  `json:"verified_by"`
	Seconds    float64 `json:"seconds"`
}

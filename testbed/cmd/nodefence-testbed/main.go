// Command nodefence-testbed runs the whole system on this machine with real peers: an embedded-etcd
// coordinator, the IPMI fence-driver, ipmi_sim BMCs, one real node-agent for this host and a few
// simulated agents (each simulated node has its own BMC).
//
//	nodefence-testbed run         start everything on fixed ports, write the run directory's env file
//	                              (source it in another terminal), run until Ctrl-C, SIGTERM or SIGHUP
//	nodefence-testbed crash NODE  make a simulated node of the running testbed die (its agent stops,
//	                              its BMC still says on) and follow the coordinator fencing it; exit 0
//	                              once the power-off is confirmed
//	nodefence-testbed demo        the same as run then crash, scripted: a node goes silent, is fenced,
//	                              the BMC is confirmed off by ipmitool; prints the timeline and, last,
//	                              one JSON line; exit 0 only on success
//
// Everything run starts is stopped on every way out: a signal, a failure while starting, a closed
// stdout (`make run | tee log`, then Ctrl-C), and the testbed being killed (its children have a
// parent-death signal).
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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// portBaseEnv moves every port of `run` when the defaults are taken.
const portBaseEnv = "NODEFENCE_TESTBED_PORT_BASE"

// runDirEnv names the run directory of the testbed `crash` talks to; the env file sets it.
const runDirEnv = "NODEFENCE_TESTBED_RUN_DIR"

// defaultPortBase is run's first port; see portPlan for the layout.
const defaultPortBase = 7400

func main() {
	// A write to a closed stdout (`make run | tee log`, Ctrl-C ends tee first) must fail, not kill the
	// testbed by SIGPIPE before it has stopped what it started.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// Ctrl-C (or kill -INT), SIGTERM and a closed terminal stop everything; SIGHUP stays ignored
	// when it was (`nohup make run`).
	stops := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stops = append(stops, syscall.SIGHUP)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), stops...)
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
	fs.StringVar(&opts.workDir, "workdir", "", "run directory for logs, state, certificates, the env file and the control socket (default for run and crash: $"+runDirEnv+", else bin/run next to the binary; for demo: bin/demo); cleared at start, removed at exit")
	fs.IntVar(&opts.simulated, "simulated", 3, "simulated nodes, each with its own ipmi_sim BMC")
	fs.IntVar(&opts.portBase, "port-base", -1, "first of run's fixed ports (default $"+portBaseEnv+", else "+strconv.Itoa(defaultPortBase)+"; 0 picks free ports; demo's default is 0)")
	fs.DurationVar(&opts.grace, "grace", 0, "node-monitor grace period (default 10s for run, 3s for demo)")
	fs.DurationVar(&opts.fenceTimeout, "fence-timeout", 0, "not-ready time before automatic fencing (default 30s for run, 2s for demo)")
	fs.BoolVar(&opts.keep, "keep", false, "keep the run directory after stopping (it is kept anyway after a failure)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: nodefence-testbed [flags] run|demo")
		fmt.Fprintln(stderr, "       nodefence-testbed [--workdir DIR] crash NODE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cmd := fs.Arg(0)
	switch {
	case cmd == "crash" && fs.NArg() == 2:
		return crash(ctx, runDir(opts), fs.Arg(1), stdout, stderr)
	case (cmd == "run" || cmd == "demo") && fs.NArg() == 1:
	default:
		fs.Usage()
		return 2
	}
	demo := cmd == "demo"
	if !settle(&opts, demo, stderr) {
		return 2
	}
	out := &lockedWriter{w: stdout}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Everything started is stopped on the way out; the run directory stays after a failure, for
	// its logs.
	code := 1
	c, err := startCluster(ctx, opts, out, log)
	if c != nil {
		defer func() { c.stop(out, opts.keep || (code != 0 && ctx.Err() == nil)) }()
	}
	if err != nil {
		fmt.Fprintln(stderr, "nodefence-testbed:", err)
		return code
	}
	if demo {
		code = runDemo(ctx, c, out, stderr)
		return code
	}
	if err := c.serveControl(ctx, out); err != nil {
		fmt.Fprintln(stderr, "nodefence-testbed:", err)
		return 1
	}
	if err := c.writeEnv(); err != nil {
		fmt.Fprintln(stderr, "nodefence-testbed:", err)
		return 1
	}
	c.printHelp(out)
	if err := c.watchProcs(ctx); err != nil {
		fmt.Fprintf(stderr, "nodefence-testbed: %v; stopping everything\n", err)
		return 1
	}
	fmt.Fprintln(out, "\nstopping ...")
	code = 0
	return code
}

// settle checks the options and fills in their defaults for run or demo. It reports what is wrong
// on stderr and returns false if anything is.
func settle(o *options, demo bool, stderr io.Writer) bool {
	var problems []string
	if o.simulated < 1 || o.simulated > 20 {
		problems = append(problems, "--simulated: must be between 1 and 20")
	}
	for _, b := range []string{"coordinator", "fence-driver", "node-agent", "fencectl"} {
		if _, err := os.Stat(filepath.Join(o.binDir, b)); err != nil {
			problems = append(problems, fmt.Sprintf("--bin: %s not found in %s (run `make build`)", b, o.binDir))
		}
	}
	if o.portBase == -1 {
		o.portBase = defaultPortBase
		if v := os.Getenv(portBaseEnv); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				problems = append(problems, fmt.Sprintf("$%s: %q is not a port number", portBaseEnv, v))
			}
			o.portBase = n
		} else if demo {
			o.portBase = 0
		}
	}
	if o.portBase != 0 && (o.portBase < 1024 || o.portBase > 65535-portSpan(o.simulated)) {
		problems = append(problems, fmt.Sprintf("--port-base: %d: must be 0 (free ports) or between 1024 and %d", o.portBase, 65535-portSpan(o.simulated)))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "nodefence-testbed:", p)
		}
		return false
	}
	if demo && o.workDir == "" {
		o.workDir = filepath.Join(o.binDir, "demo")
	}
	if !demo {
		o.workDir = runDir(*o)
		// The control socket's path must fit a unix socket address (108 bytes with its NUL).
		if abs, err := filepath.Abs(socketIn(o.workDir)); err == nil && len(abs) > 107 {
			fmt.Fprintf(stderr, "nodefence-testbed: --workdir: %s is too long for the control socket's path %s (at most 107 bytes); give a shorter --workdir\n", o.workDir, abs)
			return false
		}
	}
	if o.grace == 0 {
		o.grace = 10 * time.Second
		if demo {
			o.grace = 3 * time.Second
		}
	}
	if o.fenceTimeout == 0 {
		o.fenceTimeout = 30 * time.Second
		if demo {
			o.fenceTimeout = 2 * time.Second
		}
	}
	return true
}

// watchProcs waits until ctx ends (nil) or one of the started processes exits (an error naming it).
func (c *cluster) watchProcs(ctx context.Context) error {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, p := range c.procs {
			if exited, err := p.Exited(); exited {
				return fmt.Errorf("%s (pid %d) exited (%v); see %s", p.Name, p.PID(), err, p.Log)
			}
		}
	}
}

// runDir is the run directory of `run` and `crash`.
func runDir(opts options) string {
	switch {
	case opts.workDir != "":
		return opts.workDir
	case os.Getenv(runDirEnv) != "":
		return os.Getenv(runDirEnv)
	}
	return filepath.Join(opts.binDir, "run")
}

// printHelp tells the user how to talk to the running system.
func (c *cluster) printHelp(w io.Writer) {
	var metrics []string
	for _, m := range c.metrics() {
		metrics = append(metrics, fmt.Sprintf("%-13s http://%s/metrics", m.name, m.addr))
	}
	ports := "Ports are fixed; --port-base or $" + portBaseEnv + " moves them all."
	if c.opts.portBase == 0 {
		ports = "Ports were picked free (--port-base 0); the env file has them."
	}
	fmt.Fprintf(w, `
nodefence is running; run directory %[1]s (logs, state, certificates; removed when it stops):
  coordinator  %[2]s   (embedded etcd on %[3]s, grace period %[4]s, automatic fencing %[5]s after that)
  fence-driver %[6]s   (driver ipmi)
  BMCs         %[7]s
  agents       %[8]s (real node-agent for this host) and %[9]s (simulated)
  metrics      %[10]s
%[11]s

Everything speaks mutual TLS; you are operator/testbed. In another terminal, from the repository:
  . %[12]s      # NF_COORDINATOR, TLS, GRPCURL, NF_*_METRICS; puts grpcurl on PATH
  grpcurl $GRPCURL $NF_COORDINATOR nodefence.coordinator.v1.ClusterService/ListNodes
  bin/fencectl $TLS --coordinator $NF_COORDINATOR nodes
  bin/nodefence-testbed crash %[13]s     # %[13]s dies; watch the coordinator fence it
  curl -s $NF_COORDINATOR_METRICS | grep '^nodefence_'
Press Ctrl-C to stop everything.
`, shortPath(c.dir), c.coordAddr, c.etcdAddr, c.opts.grace, c.opts.fenceTimeout, c.driverAddr,
		strings.Join(c.bmcList(), ", "), c.hostName, strings.Join(c.simNames(), ", "),
		strings.Join(metrics, "\n               "), ports, shortPath(c.envFile()), c.victim().name)
}

// shortPath is path relative to the working directory when it is below it.
func shortPath(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}

// result is the demo's last line.
type result struct {
	Demo       string  `json:"demo"`
	Node       string  `json:"node"`
	Power      string  `json:"power"`
	VerifiedBy string  `json:"verified_by"`
	Seconds    float64 `json:"seconds"`
}

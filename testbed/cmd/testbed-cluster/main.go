// Command testbed-cluster runs the testbed's multi-node Kubernetes (package testbed/cluster) in
// the background, for `make cluster` and `make cluster-down`:
//
//	testbed-cluster up     start it (a background process holds it), print how to use kubectl
//	testbed-cluster serve  the same in the foreground, until SIGINT or SIGTERM
//	testbed-cluster down   stop it and clean up, also after its process died
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/procs"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	dir   string
	nodes int
	grace time.Duration
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testbed-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.dir, "dir", "/tmp/nodefence-cluster", "working directory (certificates, kubeconfigs, data, logs)")
	fs.IntVar(&o.nodes, "nodes", cluster.DefaultNodes, "number of nodes")
	fs.DurationVar(&o.grace, "node-monitor-grace-period", 0, "kube-controller-manager's --node-monitor-grace-period (0: its default)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: testbed-cluster [flags] up|serve|down")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		fmt.Fprintln(stderr, "testbed-cluster: --dir:", err)
		return 2
	}
	o.dir = dir
	switch fs.Arg(0) {
	case "up":
		err = up(o, args, stdout)
	case "serve":
		err = serve(o, stderr)
	case "down":
		err = down(o, stdout)
	default:
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "testbed-cluster:", err)
		return 1
	}
	return 0
}

func pidFile(dir string) string   { return filepath.Join(dir, "testbed-cluster.pid") }
func readyFile(dir string) string { return filepath.Join(dir, "testbed-cluster.ready") }
func logFile(dir string) string   { return filepath.Join(dir, "testbed-cluster.log") }

// up starts `serve` in its own session and waits until it is ready or has failed.
func up(o options, args []string, stdout io.Writer) error {
	if pid := runningPID(o.dir); pid != 0 {
		return fmt.Errorf("a cluster is already running from %s (pid %d): make cluster-down first", o.dir, pid)
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	os.Remove(readyFile(o.dir))
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.Create(logFile(o.dir))
	if err != nil {
		return err
	}
	defer logf.Close()
	serveArgs := make([]string, 0, len(args))
	for _, a := range args {
		if a != "up" {
			serveArgs = append(serveArgs, a)
		}
	}
	cmd := exec.Command(exe, append(serveArgs, "serve")...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(4 * time.Minute); ; {
		if _, err := os.Stat(readyFile(o.dir)); err == nil {
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the cluster did not start (%v); %s:\n%s", err, logFile(o.dir), procs.Tail(logFile(o.dir), 30))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster is not ready after 4 minutes; see %s (stop it with make cluster-down)", logFile(o.dir))
		}
	}
	kc := filepath.Join(o.dir, "admin.kubeconfig")
	fmt.Fprintf(stdout, `testbed cluster up in %s (%d nodes; pid %d; log %s)

  export KUBECONFIG=%s
  kubectl get nodes -o wide
  kubectl run bb --image=%s --image-pull-policy=Never -- sleep 3600

Images (no registry): %s, %s. Each node has a BMC on 127.0.0.1 (user %s, password in %s):
%s
Stop everything with: make cluster-down
`, o.dir, o.nodes, cmd.Process.Pid, logFile(o.dir), kc, cluster.BusyboxImage, cluster.BusyboxImage, cluster.PauseImage,
		cluster.BMCUser, filepath.Join(o.dir, "bmc-password"), bmcLines(o.dir))
	return nil
}

func bmcLines(dir string) string {
	data, _ := os.ReadFile(readyFile(dir))
	return string(data)
}

// serve runs the cluster in the foreground until SIGINT or SIGTERM.
func serve(o options, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(pidFile(o.dir), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile(o.dir))
	c, err := cluster.Up(ctx, cluster.Config{Dir: o.dir, Nodes: o.nodes, NodeMonitorGracePeriod: o.grace}, log)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "  %s: ipmitool -I lanplus -C 3 -H 127.0.0.1 -p %d -U %s -f %s chassis power status\n",
			n.Name, n.BMC.Port, cluster.BMCUser, c.BMCPasswordFile())
	}
	if err := os.WriteFile(readyFile(o.dir), []byte(b.String()), 0o644); err != nil {
		_ = c.Down()
		return err
	}
	<-ctx.Done()
	log.Info("stopping the cluster")
	os.Remove(readyFile(o.dir))
	err = c.Down()
	if left := c.Leftovers(); len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("left behind: %q", left))
	}
	return err
}

// runningPID is the pid of a live serve process of dir, or 0.
func runningPID(dir string) int {
	data, err := os.ReadFile(pidFile(dir))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if !strings.Contains(string(cmdline), "serve") {
		return 0 // a recycled pid
	}
	return pid
}

// down stops the serve process (SIGTERM; it tears the cluster down), or sweeps what a dead one
// left behind.
func down(o options, stdout io.Writer) error {
	if pid := runningPID(o.dir); pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
		for deadline := time.Now().Add(90 * time.Second); runningPID(o.dir) != 0; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("the cluster process did not stop within 90 s; see " + logFile(o.dir))
			}
		}
		fmt.Fprintf(stdout, "testbed cluster in %s stopped\n", o.dir)
		return nil
	}
	if err := cluster.Sweep(cluster.DefaultPrefix, 30*time.Second, nil); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "no cluster process was running; swept what one left behind")
	return nil
}

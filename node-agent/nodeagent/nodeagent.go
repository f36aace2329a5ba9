// Package nodeagent is the node-agent program (its main is cmd/node-agent): the flags, parsed into
// Config, and Main, which runs it. The node-agent runs on every node: it reads the node's eviction
// signals and streams them, with heartbeats and events, to the nodefence coordinator leader. It evaluates kubelet's eviction
// thresholds (every --housekeeping-interval, and memory.available every --memory-fast-interval),
// sends pressure condition changes at once, and, with --shutdown-grace-period or
// --shutdown-grace-period-by-pod-priority, holds a logind delay inhibitor lock to run a graceful
// node shutdown. --metrics-listen serves Prometheus metrics (over mutual TLS with --metrics-tls).
//
// As kubelet does, when logind's InhibitDelayMaxSec is below the shutdown grace period the agent
// writes 99-nodefence.conf to --logind-conf-dir, has systemd reload logind, and refuses to start
// if logind still allows less; --manage-inhibit-delay=false only warns.
//
// With --kubeconfig (a path, or "in-cluster" inside a pod) the agent runs in Kubernetes mode: it
// watches its node's pods, ranks them for eviction with their cgroups' usage (--cgroup-driver) and
// their emptyDir and log disk use (--kubelet-root-dir, --pod-log-dir), evicts the pods the
// coordinator grants through the Eviction API, and deletes the node's pods phase by phase in a
// graceful shutdown. Without it (standalone) it only reports.
//
// --shutdown-grace-period-by-pod-priority takes comma-separated priority:duration pairs, the
// flag form of kubelet's shutdownGracePeriodByPodPriority: "100000:10s,10000:3m,1000:2m,0:1m" means
// pods of priority >= 100000 get 10s, [10000, 100000) 3m, [1000, 10000) 2m, the rest 1m.
//
// Invalid flags make it exit with status 2 after listing every problem found.
package nodeagent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/cri"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/metrics"
	"github.com/nodefence/nodefence/node-agent/pressure"
	"github.com/nodefence/nodefence/node-agent/shutdown"
	"github.com/nodefence/nodefence/node-agent/signals"
	"github.com/nodefence/nodefence/services/buildinfo"
	"github.com/nodefence/nodefence/services/server"
)

// Main is the whole program: it parses args, runs until ctx ends and returns the exit status (2 for
// invalid flags, 1 for a failure to start or run).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, code, run := configure(args, stdout, stderr)
	if !run {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: opts.logLevel}))
	opts.agent.Log = log

	version, dir, ok := checkSignals(&opts, log)
	if !ok {
		return 1
	}
	runtime, ok := containerRuntime(ctx, &opts, log)
	if !ok {
		return 2
	}
	if runtime != nil {
		defer runtime.Close()
	}
	layout, evCfg, ok := diskLayout(&opts, log)
	if !ok {
		return 1
	}

	var kube *kubeMode
	if opts.kubeconfig != "" {
		var err error
		if kube, err = newKubeMode(opts, log); err != nil {
			log.Error("cannot start Kubernetes mode", "error", err)
			return 1
		}
	}
	// Grants go to the pressure monitor, which matches them with its pending candidate and hands
	// them to the evictor; the monitor needs the agent to send, so it is set once both exist.
	relay := &grantRelay{}
	opts.agent.Grants = relay
	opts.agent.Connected = relay.connected

	wd, peerTasks, ok := watchdogMode(&opts, log)
	if !ok {
		return 1
	}
	a, err := agent.New(opts.agent, signals.HostSampler{Reader: opts.reader})
	if err != nil {
		log.Error("invalid agent configuration", "error", err)
		return 2
	}
	met := metrics.New(a)
	opts.pressure.Eviction, opts.pressure.Layout, opts.pressure.Log = evCfg, layout, log
	var pods pressure.PodSource
	shutOpts := shutdown.Options{Sender: a, Recorder: met, Log: log}
	if kube != nil {
		pods, shutOpts.Pods, shutOpts.Terminator = kube.source, kube.source, kube.terminator
		kube.wire(ctx, &opts, a, met, runtime, log)
	}
	mon, err := pressure.New(opts.pressure, opts.reader, a, pods, met)
	if err != nil {
		log.Error("invalid pressure configuration", "error", err)
		return 2
	}
	relay.set(mon)
	shut, closeLogind, code := startShutdown(ctx, &opts, shutOpts, log)
	if code != 0 {
		return code
	}
	defer closeLogind()
	metricsLis, authorizeMetrics, ok := listenMetrics(&opts, log)
	if !ok {
		return 1
	}
	logStart(log, &opts, version, dir, evCfg, layout, kube != nil)
	tasks := append([]task{{"agent", a.Run}, {"pressure", mon.Run}}, kube.tasks()...)
	if shut != nil {
		tasks = append(tasks, task{"shutdown", shut.Run})
	}
	tasks = append(append(tasks, metricsTask(met, metricsLis, authorizeMetrics, log)...), peerTasks...)
	code = runWithWatchdog(ctx, tasks, wd, a, log)
	log.Info("node-agent stopped")
	return code
}

// configure parses args; unless the agent is to run, it prints what was asked for (--version) or
// every problem found, and returns the exit status.
func configure(args []string, stdout, stderr io.Writer) (Config, int, bool) {
	opts, errs, help := parse(args, stderr)
	if help {
		return opts, 0, false
	}
	if opts.version {
		fmt.Fprintln(stdout, buildinfo.String("node-agent"))
		return opts, 0, false
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(stderr, "node-agent: %v\n", err)
		}
		fmt.Fprintf(stderr, "node-agent: %d invalid flag(s); see --help\n", len(errs))
		return opts, 2, false
	}
	return opts, 0, true
}

// listenMetrics opens --metrics-listen (nil when not set), with --metrics-tls over mutual TLS and
// with the middleware that authorizes its callers.
func listenMetrics(opts *Config, log *slog.Logger) (net.Listener, func(http.Handler) http.Handler, bool) {
	if opts.metricsListen == "" {
		return nil, nil, true
	}
	var metricsTLS *tls.Config
	var authorize func(http.Handler) http.Handler
	if opts.metricsTLS {
		var err error
		if metricsTLS, authorize, err = server.SecureMetrics(opts.agent.TLS, nil, log); err != nil {
			log.Error("cannot serve metrics over TLS", "error", err)
			return nil, nil, false
		}
	}
	l, err := net.Listen("tcp", opts.metricsListen)
	if err != nil {
		log.Error("cannot listen for metrics", "address", opts.metricsListen, "error", err)
		return nil, nil, false
	}
	if metricsTLS != nil {
		l = tls.NewListener(l, metricsTLS)
	}
	return l, authorize, true
}

// logStart logs what the agent starts with.
func logStart(log *slog.Logger, opts *Config, version signals.CgroupVersion, dir string, evCfg eviction.Config, layout eviction.Layout, kube bool) {
	log.Info("node-agent starting", "node", opts.agent.NodeName, "boot_id", opts.agent.BootID,
		"coordinators", opts.agent.Coordinators, "cgroup_version", version.String(), "memory_cgroup", dir,
		"hard_thresholds", len(evCfg.Hard), "soft_thresholds", len(evCfg.Soft), "fs_layout", layout.String(), "nodefs", opts.reader.FS.NodeFS,
		"housekeeping_interval", opts.pressure.HousekeepingInterval, "graceful_shutdown", opts.shutdown.Enabled(),
		"kubernetes_mode", kube)
}

// checkSignals fails fast when the signals cannot be read at all, and takes the node's capacity
// for the hello. It returns the cgroup version and memory cgroup found.
func checkSignals(opts *Config, log *slog.Logger) (signals.CgroupVersion, string, bool) {
	version, dir, err := opts.reader.Detect()
	if err != nil {
		log.Error("cannot find the memory cgroup", "error", err)
		return version, dir, false
	}
	if _, err := opts.reader.Read(); err != nil {
		log.Error("cannot read the eviction signals", "reader", opts.reader.String(), "error", err)
		return version, dir, false
	}
	if c, err := opts.reader.Capacity(); err != nil {
		log.Warn("cannot read the node capacity; the hello will carry none", "error", err)
	} else {
		opts.agent.Capacity = c
	}
	return version, dir, true
}

// diskLayout measures how nodefs, imagefs and containerfs share filesystems and derives the
// containerfs thresholds kubelet would from it.
func diskLayout(opts *Config, log *slog.Logger) (eviction.Layout, eviction.Config, bool) {
	layout := eviction.LayoutSingle
	if opts.reader.FS.NodeFS != "" {
		var err error
		if _, _, _, layout, err = opts.reader.FS.Disks(); err != nil {
			log.Error("cannot measure the filesystems", "error", err)
			return layout, eviction.Config{}, false
		}
	}
	evCfg, warnings := eviction.DeriveContainerFS(opts.eviction, layout)
	for _, w := range warnings {
		log.Warn(w)
	}
	return layout, evCfg, true
}

// containerRuntime connects to --container-runtime-endpoint and takes the image and container
// filesystems from it when they are not given. A missing socket is no runtime (nil, true); one
// that cannot be used is an error (nil, false).
func containerRuntime(ctx context.Context, opts *Config, log *slog.Logger) (*cri.Client, bool) {
	if opts.criEndpoint == "" {
		return nil, true
	}
	sock := strings.TrimPrefix(opts.criEndpoint, "unix://")
	if _, err := os.Stat(sock); err != nil {
		log.Warn("no container runtime socket: no image filesystem discovery, writable layers or image GC", "endpoint", opts.criEndpoint, "error", err)
		return nil, true
	}
	runtime, err := cri.Dial(opts.criEndpoint, log)
	if err != nil {
		log.Error("cannot use the container runtime", "error", err)
		return nil, false
	}
	runtime.ImageMinAge = opts.imageMinGCAge
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	image, container, err := runtime.ImageFS(ictx)
	cancel()
	switch {
	case err != nil:
		log.Warn("the container runtime does not tell its image filesystem", "error", err)
	case opts.reader.FS.NodeFS != "" && opts.reader.FS.ImageFS == "" && image.Mountpoint != "":
		opts.reader.FS.ImageFS = image.Mountpoint
		if opts.reader.FS.ContainerFS == "" && container.Mountpoint != "" {
			opts.reader.FS.ContainerFS = container.Mountpoint
		}
		log.Info("image filesystem from the container runtime", "imagefs", image.Mountpoint, "containerfs", container.Mountpoint)
	}
	return runtime, true
}

// startShutdown connects to logind for a graceful shutdown when one is configured and makes sure
// (or, with --manage-inhibit-delay=false, warns unless) logind waits as long as the grace period.
// It returns the manager (nil when off), what closes the logind connection, and an exit status
// (0 to go on).
func startShutdown(ctx context.Context, opts *Config, shutOpts shutdown.Options, log *slog.Logger) (*shutdown.Manager, func(), int) {
	if !opts.shutdown.Enabled() {
		return nil, func() {}, 0
	}
	l, err := shutdown.DialLogind(ctx, opts.logindBus)
	if err != nil {
		log.Error("graceful shutdown needs logind", "error", err)
		return nil, nil, 1
	}
	if opts.manageInhibitDelay {
		d, err := shutdown.EnsureInhibitDelay(ctx, l, opts.logindConfDir, opts.shutdown.Total())
		if err != nil {
			log.Error("cannot raise logind's InhibitDelayMaxSec to the shutdown grace period (--manage-inhibit-delay=false only warns)",
				"grace_period", opts.shutdown.Total(), "error", err)
			l.Close()
			return nil, nil, 1
		}
		if d.DropIn != "" {
			log.Info("raised logind's InhibitDelayMaxSec to the shutdown grace period", "drop_in", d.DropIn,
				"inhibit_delay_max_before", d.Before, "inhibit_delay_max", d.After, "grace_period", opts.shutdown.Total())
		}
	} else if us, err := l.InhibitDelayMax(ctx); err != nil {
		log.Warn("cannot read logind's InhibitDelayMaxUSec", "error", err)
	} else if max := shutdown.USecDuration(us); max < opts.shutdown.Total() {
		log.Warn("logind's InhibitDelayMaxSec is below the shutdown grace period: the shutdown will not wait that long",
			"inhibit_delay_max", max, "grace_period", opts.shutdown.Total())
	}
	shutOpts.Inhibitor = shutdown.LogindInhibitor{Logind: l}
	shut, err := shutdown.NewManager(opts.shutdown, shutOpts)
	if err != nil {
		log.Error("invalid shutdown configuration", "error", err)
		l.Close()
		return nil, nil, 2
	}
	return shut, func() { l.Close() }, 0
}

// metricsTask serves the metrics endpoint, if there is one.
func metricsTask(met *metrics.Metrics, lis net.Listener, authorize func(http.Handler) http.Handler, log *slog.Logger) []task {
	if lis == nil {
		return nil
	}
	return []task{{"metrics", func(ctx context.Context) error { return met.Serve(ctx, lis, authorize, log) }}}
}

// task is one part of the running agent.
type task struct {
	name string
	run  func(context.Context) error
}

// runTasks runs every task until one stops, then stops the others; it returns 1 when any failed.
func runTasks(ctx context.Context, tasks []task, log *slog.Logger) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(tasks))
	for _, t := range tasks {
		go func() {
			err := t.run(ctx)
			if err != nil {
				err = fmt.Errorf("%s: %w", t.name, err)
			}
			cancel() // one part stopping stops the agent
			errc <- err
		}()
	}
	code := 0
	for range tasks {
		if err := <-errc; err != nil {
			log.Error("agent stopped", "error", err)
			code = 1
		}
	}
	return code
}

// Package nodeagent is the node-agent program (its main is cmd/node-agent): the flags, parsed into
// Config, and Main, which runs it. The node-agent runs on every node: it reads the node's eviction
// signals and streams them, with heartbeats and events, to the nodefence coordinator leader. It evaluates kubelet's eviction
// thresholds (every --housekeeping-interval, and memory.available every --memory-fast-interval),
// sends pressure condition changes at once, and, with --shutdown-grace-period or
// --shutdown-grace-period-by-pod-priority, holds a logind delay inhibitor lock to run a graceful
// node shutdown. --metrics-listen serves Prometheus metrics.
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
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/cri"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/kubepods"
	"github.com/nodefence/nodefence/node-agent/metrics"
	"github.com/nodefence/nodefence/node-agent/pressure"
	"github.com/nodefence/nodefence/node-agent/shutdown"
	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/buildinfo"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
)

// Config is everything the flags configure.
type Config struct {
	agent    agent.Config
	reader   signals.Reader
	eviction eviction.Config
	pressure pressure.Config
	shutdown shutdown.Config
	// logindBus is the D-Bus address logind is reached on ("" = the system bus).
	logindBus string
	// manageInhibitDelay raises logind's InhibitDelayMaxSec to the shutdown grace period when it
	// is lower (false: only warn).
	manageInhibitDelay bool
	// logindConfDir is the logind.conf.d directory the agent's drop-in goes to.
	logindConfDir string
	// metricsListen is the metrics address ("" = no metrics endpoint).
	metricsListen string
	// kubeconfig enables Kubernetes mode: a kubeconfig path, or "in-cluster" ("" = standalone).
	kubeconfig string
	// cgroupDriver is how the kubelet names pod cgroups.
	cgroupDriver kubepods.CgroupDriver
	// kubeletRootDir is the kubelet's --root-dir, where pods' emptyDir volumes are measured.
	kubeletRootDir string
	// podLogDir is where the kubelet keeps pod logs, measured for each pod.
	podLogDir string
	// criEndpoint is the container runtime's CRI socket ("" = none).
	criEndpoint string
	logLevel    slog.Level
	// version asks for the version instead of a run.
	version bool
}

// problems collects flag value errors so that all of them are reported, not just the first.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// value is a flag.Value that parses with set and records a failure instead of stopping the parse.
type value struct {
	name string
	text string
	set  func(string) error
	errs *problems
}

func (v *value) String() string { return v.text }
func (v *value) Set(s string) error {
	v.text = s
	if err := v.set(s); err != nil {
		v.errs.add("--%s: %q: %v", v.name, s, err)
	}
	return nil
}

// flagFor names the flag behind each agent.Config field, for error messages.
var flagFor = map[string]string{
	"Coordinators": "--coordinator", "NodeName": "--node-name", "BootID": "--boot-id-file",
	"Zone": "--zone", "Region": "--region", "Labels": "--label",
	"HeartbeatInterval": "--heartbeat-interval", "SampleInterval": "--sample-interval",
}

// parse turns args into a Config, returning every problem found. A nil error list with help=true
// means --help was asked for.
func parse(args []string, stderr io.Writer) (opts Config, errs problems, help bool) {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: node-agent --coordinator=host:port[,host:port...] [flags]")
		fs.PrintDefaults()
	}
	a := &opts.agent
	a.Labels = map[string]string{}
	var coordinators, nodeName, bootIDFile string
	a.HeartbeatInterval, a.SampleInterval = agent.DefaultHeartbeatInterval, agent.DefaultSampleInterval
	var ev eviction.Flags
	ev.PressureTransitionPeriod = 5 * time.Minute

	duration := func(name string, dst *time.Duration, usage string) {
		v := &value{name: name, text: dst.String(), errs: &errs, set: func(s string) error {
			d, err := time.ParseDuration(s)
			if err == nil {
				*dst = d
			}
			return err
		}}
		fs.Var(v, name, usage)
	}
	fs.StringVar(&coordinators, "coordinator", "", "comma-separated coordinator addresses (host:port); the agent follows the leader (required)")
	fs.StringVar(&nodeName, "node-name", "", "the node's name (default: the lowercased hostname)")
	fs.StringVar(&a.Zone, "zone", "", "the node's topology.kubernetes.io/zone")
	fs.StringVar(&a.Region, "region", "", "the node's topology.kubernetes.io/region")
	fs.Var(&value{name: "label", errs: &errs, set: func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return errors.New("want key=value")
		}
		if _, dup := a.Labels[k]; dup {
			return fmt.Errorf("label %q given twice", k)
		}
		a.Labels[k] = v
		return nil
	}}, "label", "an extra node label key=value (repeatable)")
	fs.StringVar(&bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the boot id")
	duration("heartbeat-interval", &a.HeartbeatInterval, "heartbeat interval until the coordinator sets one")
	duration("sample-interval", &a.SampleInterval, "signal sample interval until the coordinator sets one")
	fs.StringVar(&opts.reader.ProcRoot, "proc-root", signals.DefaultProcRoot, "where procfs is mounted")
	fs.StringVar(&opts.reader.CgroupRoot, "cgroup-root", signals.DefaultCgroupRoot, "where the cgroup filesystems are mounted")
	fs.Var(&value{name: "cgroup-version", text: "auto", errs: &errs, set: func(s string) (err error) {
		opts.reader.CgroupVersion, err = signals.ParseCgroupVersion(s)
		return err
	}}, "cgroup-version", "cgroup hierarchy memory.available is read from: auto, 1 or 2")
	a.TLS.RegisterFlags(fs, "", "the coordinator connection")
	fs.Var(&value{name: "log-level", text: "info", errs: &errs, set: func(s string) error {
		return opts.logLevel.UnmarshalText([]byte(s))
	}}, "log-level", "debug, info, warn or error")

	// kubelet's --eviction-* are map flags: given again, they add to (and override signals of) what
	// was given before; --eviction-hard given at all replaces the default.
	accumulate := func(dst *string) func(string) error {
		return func(s string) error {
			if *dst != "" {
				*dst += ","
			}
			*dst += s
			return nil
		}
	}
	fs.Var(&value{name: "eviction-hard", text: eviction.DefaultHard, errs: &errs, set: func(s string) error {
		ev.HardSet = true
		return accumulate(&ev.Hard)(s)
	}}, "eviction-hard", "kubelet's hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10% (repeatable, as kubelet's); the agent evicts at once on its own node")
	fs.Var(&value{name: "eviction-soft", errs: &errs, set: accumulate(&ev.Soft)}, "eviction-soft",
		"kubelet's soft eviction thresholds, e.g. memory.available<1.5Gi (repeatable); past their grace period the coordinator paces the evictions")
	fs.Var(&value{name: "eviction-soft-grace-period", errs: &errs, set: accumulate(&ev.SoftGracePeriod)}, "eviction-soft-grace-period",
		"grace periods of the soft thresholds, e.g. memory.available=1m30s (repeatable)")
	fs.Var(&value{name: "eviction-minimum-reclaim", errs: &errs, set: accumulate(&ev.MinimumReclaim)}, "eviction-minimum-reclaim",
		"minimum reclaims, e.g. memory.available=0Mi,nodefs.available=500Mi (repeatable)")
	enforce := "pods"
	fs.StringVar(&enforce, "enforce-node-allocatable", enforce, "kubelet's --enforce-node-allocatable: with \"pods\" in it (kubelet's default) the hard memory.available threshold is copied to allocatableMemory.available, measured on the pods' cgroup (kubepods)")
	fs.DurationVar(&opts.pressure.GrantTimeout, "eviction-grant-timeout", pressure.DefaultGrantTimeout,
		"how long a soft-threshold candidate waits for the coordinator's grant before the agent evicts it itself (coordinator unreachable)")
	duration("eviction-pressure-transition-period", &ev.PressureTransitionPeriod, "how long a pressure condition stays after its threshold stops being met")
	fs.Var(&value{name: "eviction-max-pod-grace-period", text: "0", errs: &errs, set: func(s string) (err error) {
		ev.MaxPodGracePeriod, err = strconv.Atoi(s)
		return err
	}}, "eviction-max-pod-grace-period", "maximum pod grace period in seconds for soft evictions (0: evicted pods are killed at once, as kubelet does)")
	opts.pressure.HousekeepingInterval = pressure.DefaultHousekeepingInterval
	opts.pressure.FastInterval = pressure.DefaultFastInterval
	duration("housekeeping-interval", &opts.pressure.HousekeepingInterval, "how often every eviction signal is read and the thresholds evaluated (kubelet's)")
	opts.pressure.FastCeiling = pressure.DefaultFastCeiling
	duration("memory-fast-max-interval", &opts.pressure.FastCeiling, "longest wait between memory.available reads on the fast path: the detection bound when memory falls faster than expected")
	duration("memory-fast-interval", &opts.pressure.FastInterval, "shortest wait between memory.available reads on the fast path, which waits longer the further memory is from its thresholds (0 turns it off)")
	fs.StringVar(&opts.reader.FS.NodeFS, "nodefs-path", "", "a path on nodefs (default: --kubelet-root-dir, as kubelet's nodefs is its root dir's filesystem; when that does not exist, no filesystem signals); empty: no filesystem signals")
	fs.StringVar(&opts.reader.FS.ImageFS, "imagefs-path", "", "a path on imagefs, where the runtime keeps images (default: the runtime's image filesystem from CRI ImageFsInfo, else --nodefs-path)")
	fs.StringVar(&opts.reader.FS.ContainerFS, "containerfs-path", "", "a path on containerfs, where the runtime keeps writable layers (default: the runtime's container filesystem from CRI, else --imagefs-path)")
	fs.StringVar(&opts.criEndpoint, "container-runtime-endpoint", cri.DefaultEndpoint, "kubelet's --container-runtime-endpoint (a unix socket): image filesystem discovery, writable layers for disk ranking, and dead containers and unused images freed before evicting for disk pressure; a socket that does not exist turns these off (logged); empty: off")
	duration("shutdown-grace-period", &opts.shutdown.GracePeriod, "kubelet's shutdownGracePeriod: how long a node shutdown is delayed for pod termination (0 and 0 critical: off)")
	duration("shutdown-grace-period-critical-pods", &opts.shutdown.CriticalGracePeriod, "kubelet's shutdownGracePeriodCriticalPods: the part of --shutdown-grace-period kept for critical pods")
	fs.Var(&value{name: "shutdown-grace-period-by-pod-priority", errs: &errs, set: func(s string) (err error) {
		opts.shutdown.ByPriority, err = shutdown.ParseByPriority(s)
		return err
	}}, "shutdown-grace-period-by-pod-priority", "kubelet's shutdownGracePeriodByPodPriority as priority:duration pairs, e.g. 100000:10s,10000:3m,0:1m")
	fs.StringVar(&opts.logindBus, "logind-bus", "", "D-Bus address logind is reached on (default: the system bus)")
	fs.BoolVar(&opts.manageInhibitDelay, "manage-inhibit-delay", true, "raise logind's InhibitDelayMaxSec to the shutdown grace period when it is lower, as kubelet does: write "+
		shutdown.DropInName+" to --logind-conf-dir and reload logind (false: only warn)")
	fs.StringVar(&opts.logindConfDir, "logind-conf-dir", shutdown.DefaultLogindConfDir, "the logind.conf.d directory --manage-inhibit-delay writes its drop-in to")
	fs.StringVar(&opts.kubeconfig, "kubeconfig", "", `Kubernetes mode: a kubeconfig path, or "in-cluster" inside a pod (default: standalone, no pods)`)
	fs.Var(&value{name: "cgroup-driver", text: "auto", errs: &errs, set: func(s string) (err error) {
		opts.cgroupDriver, err = kubepods.ParseCgroupDriver(s)
		return err
	}}, "cgroup-driver", "the kubelet's --cgroup-driver, to find pod cgroups in Kubernetes mode: auto, cgroupfs or systemd")
	fs.StringVar(&opts.kubeletRootDir, "kubelet-root-dir", kubepods.DefaultKubeletRoot, "the kubelet's --root-dir, where Kubernetes mode measures pods' emptyDir volumes for disk ranking")
	fs.StringVar(&opts.podLogDir, "pod-log-dir", kubepods.DefaultPodLogDir, "where the kubelet keeps pod logs, measured for disk ranking in Kubernetes mode")
	fs.BoolVar(&opts.version, "version", false, "print the version and exit")
	fs.StringVar(&opts.metricsListen, "metrics-listen", "", "address to serve Prometheus /metrics on, e.g. 127.0.0.1:9811 (default: none)")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return opts, nil, true
		}
		errs = append(errs, err)
		return opts, errs, false
	}
	if fs.NArg() > 0 {
		errs.add("unexpected arguments: %q", fs.Args())
	}

	for _, c := range strings.Split(coordinators, ",") {
		if c = strings.TrimSpace(c); c != "" {
			a.Coordinators = append(a.Coordinators, c)
		}
	}
	if nodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			errs.add("--node-name: not set and the hostname is unknown: %v", err)
		}
		nodeName = strings.ToLower(host)
	}
	a.NodeName = nodeName
	if id, err := os.ReadFile(bootIDFile); err != nil {
		errs.add("--boot-id-file: %v", err)
	} else if a.BootID = strings.TrimSpace(string(id)); a.BootID == "" {
		errs.add("--boot-id-file: %s is empty", bootIDFile)
	}
	if a.TLS.CertFile != "" && !a.TLS.Insecure {
		// The coordinator accepts an agent only for the node its certificate names: say so now
		// rather than in a reconnect loop.
		if id, err := certs.IdentityOfFile(a.TLS.CertFile); err != nil {
			errs.add("--tls-cert: %v", err)
		} else if id.Role != identity.Agent || id.Name != nodeName {
			errs.add("--tls-cert: the certificate is %s, but an agent for node %q needs spiffe://%s/agent/%s", id, nodeName, identity.TrustDomain, nodeName)
		}
	}
	if err := a.Validate(); err != nil {
		var inv fault.Invalid
		if !errors.As(err, &inv) {
			errs = append(errs, err)
		}
		for _, fe := range inv {
			if fe.Field == "TLS" {
				errs.add("%s", fe.Problem) // already names the --tls-* flag
				continue
			}
			field, _, _ := strings.Cut(fe.Field, "[")
			if fe.Field == "BootID" && a.BootID == "" {
				continue // reported above with the file's error
			}
			name, ok := flagFor[field]
			if !ok {
				name = fe.Field
			}
			errs.add("%s: %s", name, fe.Problem)
		}
	}
	for _, k := range strings.Split(enforce, ",") {
		switch strings.TrimSpace(k) {
		case "pods":
			ev.AllocatableMemory = true
			opts.reader.PodsCgroups = signals.DefaultPodsCgroups
		case "", "none", "system-reserved", "kube-reserved", "system-reserved-compressible", "kube-reserved-compressible":
		default:
			errs.add("--enforce-node-allocatable: %q: unknown key (want pods, system-reserved, kube-reserved, none)", k)
		}
	}
	if opts.pressure.GrantTimeout <= 0 {
		errs.add("--eviction-grant-timeout: %v: must be positive", opts.pressure.GrantTimeout)
	}
	nodefsSet := false
	fs.Visit(func(f *flag.Flag) { nodefsSet = nodefsSet || f.Name == "nodefs-path" })
	if !nodefsSet {
		// kubelet's nodefs is the filesystem of its --root-dir.
		opts.reader.FS.NodeFS = opts.kubeletRootDir
		if _, err := os.Stat(opts.kubeletRootDir); err != nil {
			opts.reader.FS.NodeFS = "" // no kubelet here: no filesystem signals (logged at start)
		}
	}
	var evErrs []error
	opts.eviction, evErrs = eviction.Parse(ev)
	errs = append(errs, evErrs...)
	if opts.pressure.HousekeepingInterval <= 0 {
		errs.add("--housekeeping-interval: %v: must be positive", opts.pressure.HousekeepingInterval)
	}
	switch {
	case opts.pressure.FastInterval < 0:
		errs.add("--memory-fast-interval: %v: must not be negative", opts.pressure.FastInterval)
	case opts.pressure.FastInterval == 0:
		opts.pressure.FastInterval = -1 // off
	case opts.pressure.FastCeiling < opts.pressure.FastInterval:
		errs.add("--memory-fast-max-interval: %v is below --memory-fast-interval %v", opts.pressure.FastCeiling, opts.pressure.FastInterval)
	}
	errs = append(errs, opts.shutdown.Validate()...)
	confDirSet := false
	fs.Visit(func(f *flag.Flag) { confDirSet = confDirSet || f.Name == "logind-conf-dir" })
	switch {
	case !opts.manageInhibitDelay && confDirSet:
		errs.add("--logind-conf-dir: has no effect with --manage-inhibit-delay=false")
	case opts.manageInhibitDelay && opts.logindConfDir == "":
		errs.add("--logind-conf-dir: must not be empty with --manage-inhibit-delay")
	case opts.manageInhibitDelay && !filepath.IsAbs(opts.logindConfDir):
		errs.add("--logind-conf-dir: %q: must be an absolute path", opts.logindConfDir)
	}
	for _, d := range []struct{ flag, dir string }{{"--kubelet-root-dir", opts.kubeletRootDir}, {"--pod-log-dir", opts.podLogDir}} {
		if !filepath.IsAbs(d.dir) {
			errs.add("%s: %q: must be an absolute path", d.flag, d.dir)
		}
	}
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return opts, errs, false
}

// Main is the whole program: it parses args, runs until ctx ends and returns the exit status (2 for
// invalid flags, 1 for a failure to start or run).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, errs, help := parse(args, stderr)
	if help {
		return 0
	}
	if opts.version {
		fmt.Fprintln(stdout, buildinfo.String("node-agent"))
		return 0
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(stderr, "node-agent: %v\n", err)
		}
		fmt.Fprintf(stderr, "node-agent: %d invalid flag(s); see --help\n", len(errs))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: opts.logLevel}))
	opts.agent.Log = log

	// Fail fast when the signals cannot be read at all.
	version, dir, err := opts.reader.Detect()
	if err != nil {
		log.Error("cannot find the memory cgroup", "error", err)
		return 1
	}
	if _, err := opts.reader.Read(); err != nil {
		log.Error("cannot read the eviction signals", "reader", opts.reader.String(), "error", err)
		return 1
	}
	if c, err := opts.reader.Capacity(); err != nil {
		log.Warn("cannot read the node capacity; the hello will carry none", "error", err)
	} else {
		opts.agent.Capacity = c
	}

	var runtime *cri.Client
	if opts.criEndpoint != "" {
		sock := strings.TrimPrefix(opts.criEndpoint, "unix://")
		if _, err := os.Stat(sock); err != nil {
			log.Warn("no container runtime socket: no image filesystem discovery, writable layers or image GC", "endpoint", opts.criEndpoint, "error", err)
		} else if runtime, err = cri.Dial(opts.criEndpoint, log); err != nil {
			log.Error("cannot use the container runtime", "error", err)
			return 2
		} else {
			defer runtime.Close()
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
		}
	}
	layout := eviction.LayoutSingle
	if opts.reader.FS.NodeFS != "" {
		var err error
		if _, _, _, layout, err = opts.reader.FS.Disks(); err != nil {
			log.Error("cannot measure the filesystems", "error", err)
			return 1
		}
	}
	evCfg, warnings := eviction.DeriveContainerFS(opts.eviction, layout)
	for _, w := range warnings {
		log.Warn(w)
	}

	var kube *kubeMode
	if opts.kubeconfig != "" {
		if kube, err = newKubeMode(opts, log); err != nil {
			log.Error("cannot start Kubernetes mode", "error", err)
			return 1
		}
	}
	// Grants go to the pressure monitor, which matches them with its pending candidate and hands
	// them to the evictor; the monitor needs the agent to send, so it is set once both exist.
	relay := &grantRelay{}
	opts.agent.Grants = relay

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
		kube.evictor = kubepods.NewEvictor(kube.client, kubepods.EvictorConfig{Log: log, Done: func(c eviction.Candidate, signal string, out kubepods.Outcome, err error) {
			kind, msg := agentv1.EvictionKind_EVICTION_KIND_GRANTED, "evicted through the Eviction API"
			switch {
			case out == kubepods.Gone:
				msg = "the pod was gone already"
			case out != kubepods.Evicted:
				kind, msg = agentv1.EvictionKind_EVICTION_KIND_FAILED, fmt.Sprintf("the Eviction API refused: %v", err)
			}
			a.Send(pressure.EvictionReport(c, signal, kind, msg, time.Now()))
			met.Eviction(signal, kind.String())
		}})
		opts.pressure.Actions = pressure.Actions{Killer: kube.killer, Cleanup: kube.killer, Granted: kube.evictor}
		if runtime != nil {
			opts.pressure.Actions.Node = func(ctx context.Context, containers, images bool) (string, error) {
				r, err := runtime.Reclaim(ctx, containers, images)
				return fmt.Sprintf("%d dead containers, %d unused images", r.Containers, r.Images), err
			}
			kube.source.SetWritable(func(ctx context.Context) (map[string][2]int64, error) {
				w, err := runtime.Writable(ctx)
				out := make(map[string][2]int64, len(w))
				for uid, u := range w {
					out[uid] = [2]int64{u.Bytes, u.Inodes}
				}
				return out, err
			})
		}
	}
	mon, err := pressure.New(opts.pressure, opts.reader, a, pods, met)
	if err != nil {
		log.Error("invalid pressure configuration", "error", err)
		return 2
	}
	relay.set(mon)
	var shut *shutdown.Manager
	if opts.shutdown.Enabled() {
		l, err := shutdown.DialLogind(ctx, opts.logindBus)
		if err != nil {
			log.Error("graceful shutdown needs logind", "error", err)
			return 1
		}
		defer l.Close()
		if opts.manageInhibitDelay {
			d, err := shutdown.EnsureInhibitDelay(ctx, l, opts.logindConfDir, opts.shutdown.Total())
			if err != nil {
				log.Error("cannot raise logind's InhibitDelayMaxSec to the shutdown grace period (--manage-inhibit-delay=false only warns)",
					"grace_period", opts.shutdown.Total(), "error", err)
				return 1
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
		shut, err = shutdown.NewManager(opts.shutdown, shutOpts)
		if err != nil {
			log.Error("invalid shutdown configuration", "error", err)
			return 2
		}
	}
	var metricsLis net.Listener
	if opts.metricsListen != "" {
		if metricsLis, err = net.Listen("tcp", opts.metricsListen); err != nil {
			log.Error("cannot listen for metrics", "address", opts.metricsListen, "error", err)
			return 1
		}
	}
	log.Info("node-agent starting", "node", opts.agent.NodeName, "boot_id", opts.agent.BootID,
		"coordinators", opts.agent.Coordinators, "cgroup_version", version.String(), "memory_cgroup", dir,
		"hard_thresholds", len(evCfg.Hard), "soft_thresholds", len(evCfg.Soft), "fs_layout", layout.String(), "nodefs", opts.reader.FS.NodeFS,
		"housekeeping_interval", opts.pressure.HousekeepingInterval, "graceful_shutdown", opts.shutdown.Enabled(),
		"kubernetes_mode", kube != nil)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type task struct {
		name string
		run  func(context.Context) error
	}
	tasks := []task{{"agent", a.Run}, {"pressure", mon.Run}}
	if shut != nil {
		tasks = append(tasks, task{"shutdown", shut.Run})
	}
	if kube != nil {
		tasks = append(tasks, task{"pod source", kube.source.Run}, task{"evictor", kube.evictor.Run})
	}
	if metricsLis != nil {
		tasks = append(tasks, task{"metrics", func(ctx context.Context) error { return met.Serve(ctx, metricsLis, log) }})
	}
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
	log.Info("node-agent stopped")
	return code
}

// grantRelay hands the coordinator's grants to the pressure monitor once it exists; grants before
// that are logged and dropped (there is no candidate they could answer yet).
type grantRelay struct {
	mu  sync.Mutex
	mon *pressure.Monitor
}

func (r *grantRelay) set(m *pressure.Monitor) {
	r.mu.Lock()
	r.mon = m
	r.mu.Unlock()
}

func (r *grantRelay) Grant(g *agentv1.EvictionGrant) {
	r.mu.Lock()
	m := r.mon
	r.mu.Unlock()
	if m == nil {
		slog.Warn("eviction grant before the pressure monitor started; dropped", "signal", g.GetSignal())
		return
	}
	m.Grant(g)
}

// kubeMode is what Kubernetes mode adds: the node's pods, the local killer (hard thresholds and
// fallbacks), the evictor of granted pods and the shutdown's terminator.
type kubeMode struct {
	client     *kubepods.Client
	source     *kubepods.Source
	killer     *kubepods.Killer
	evictor    *kubepods.Evictor
	terminator *kubepods.Terminator
}

func newKubeMode(opts Config, log *slog.Logger) (*kubeMode, error) {
	var rc *rest.Config
	var err error
	if opts.kubeconfig == "in-cluster" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	cs, err := kubepods.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	cg := kubepods.Cgroups{Root: opts.reader.CgroupRoot, Version: opts.reader.CgroupVersion, Driver: opts.cgroupDriver}
	disk := &kubepods.Disk{KubeletRoot: opts.kubeletRootDir, PodLogDir: opts.podLogDir}
	src, err := kubepods.NewSource(cs, opts.agent.NodeName, cg, log, kubepods.WithDisk(disk))
	if err != nil {
		return nil, err
	}
	return &kubeMode{
		client:     cs,
		source:     src,
		killer:     kubepods.NewKiller(cs, opts.agent.NodeName, src, 0, log),
		terminator: kubepods.NewTerminator(cs, kubepods.TerminatorConfig{Log: log}),
	}, nil
}

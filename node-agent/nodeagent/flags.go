package nodeagent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/cri"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/kubepods"
	"github.com/nodefence/nodefence/node-agent/peer"
	"github.com/nodefence/nodefence/node-agent/pressure"
	"github.com/nodefence/nodefence/node-agent/shutdown"
	"github.com/nodefence/nodefence/node-agent/signals"
	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/server"
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
	// watchdogDevice is the watchdog device the agent arms and feeds ("" = none); watchdogTimeout
	// its timeout (watchdog.go).
	watchdogDevice  string
	watchdogTimeout time.Duration
	// peerListen is where the agent answers other agents' peer checks ("" = nowhere); peers are the
	// other agents it asks when it holds no lease (watchdog.go, node-agent/peer).
	peerListen string
	peers      []peer.Peer
	// metricsTLS serves metricsListen over mutual TLS with the agent's --tls-* files, answering only
	// callers the identity policy allows for /metrics.
	metricsTLS bool
	// kubeconfig enables Kubernetes mode: a kubeconfig path, or "in-cluster" ("" = standalone).
	kubeconfig string
	// cgroupDriver is how the kubelet names pod cgroups.
	cgroupDriver kubepods.CgroupDriver
	// kubeletRootDir is the kubelet's --root-dir, where pods' emptyDir volumes are measured.
	kubeletRootDir string
	// kubeletCgroupRoot is the kubelet's --cgroup-root: the pods' cgroups are under it.
	kubeletCgroupRoot string
	// podLogDir is where the kubelet keeps pod logs, measured for each pod.
	podLogDir string
	// criEndpoint is the container runtime's CRI socket ("" = none).
	criEndpoint string
	// imageMinGCAge is kubelet's --image-minimum-gc-age for the node-level image reclaim.
	imageMinGCAge time.Duration
	logLevel      slog.Level
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

// flags is one parse of the command line: the Config it fills, every problem found, and the
// values that become Config only once all flags are read.
type flags struct {
	fs   *flag.FlagSet
	opts *Config
	errs problems
	// coordinators, nodeName, bootIDFile and enforce are the raw --coordinator, --node-name,
	// --boot-id-file and --enforce-node-allocatable.
	coordinators, nodeName, bootIDFile, enforce string
	ev                                          eviction.Flags
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
	f := &flags{fs: fs, opts: &opts}
	f.registerAgent()
	f.registerEviction()
	f.registerNode()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return opts, nil, true
		}
		return opts, append(f.errs, err), false
	}
	if fs.NArg() > 0 {
		f.errs.add("unexpected arguments: %q", fs.Args())
	}
	f.resolveAgent()
	f.resolveEviction()
	f.resolveNode()
	errs = f.errs
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return opts, errs, false
}

// duration registers a duration flag whose bad values are recorded as problems.
func (f *flags) duration(name string, dst *time.Duration, usage string) {
	v := &value{name: name, text: dst.String(), errs: &f.errs, set: func(s string) error {
		d, err := time.ParseDuration(s)
		if err == nil {
			*dst = d
		}
		return err
	}}
	f.fs.Var(v, name, usage)
}

// registerAgent registers the stream's flags: the coordinators, the node's identity and place,
// where signals are read, TLS and logging.
func (f *flags) registerAgent() {
	fs, opts, errs := f.fs, f.opts, &f.errs
	a := &opts.agent
	a.Labels = map[string]string{}
	a.HeartbeatInterval, a.SampleInterval = agent.DefaultHeartbeatInterval, agent.DefaultSampleInterval
	fs.StringVar(&f.coordinators, "coordinator", "", "comma-separated coordinator addresses (host:port); the agent follows the leader (required)")
	fs.StringVar(&f.nodeName, "node-name", "", "the node's name (default: the lowercased hostname)")
	fs.StringVar(&a.Zone, "zone", "", "the node's topology.kubernetes.io/zone")
	fs.StringVar(&a.Region, "region", "", "the node's topology.kubernetes.io/region")
	fs.Var(&value{name: "label", errs: errs, set: func(s string) error {
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
	fs.StringVar(&f.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the boot id")
	opts.watchdogTimeout = defaultWatchdogTimeout
	fs.StringVar(&opts.watchdogDevice, "watchdog-device", "", "a Linux watchdog device to arm and feed, e.g. /dev/watchdog (default: none). A clean stop disarms it; an agent killed and not restarted within the timeout resets its node")
	f.duration("watchdog-timeout", &opts.watchdogTimeout, "the watchdog's timeout (whole seconds); a device without the timeout ioctl keeps its own, and this value is reported")
	fs.StringVar(&opts.peerListen, "peer-listen", "", "watchdog mode: address to answer other agents' lease checks on, over mutual TLS with the --tls-* files (default: none)")
	fs.Var(&value{name: "peer", errs: errs, set: func(s string) error {
		name, addr, ok := strings.Cut(s, "=")
		if !ok {
			return errors.New("want NODE=HOST:PORT")
		}
		if err := identity.ValidName(name); err != nil {
			return err
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return err
		}
		for _, p := range opts.peers {
			if p.Name == name {
				return fmt.Errorf("peer %q given twice", name)
			}
		}
		if len(opts.peers) >= peer.MaxPeers {
			return fmt.Errorf("more than %d peers", peer.MaxPeers)
		}
		opts.peers = append(opts.peers, peer.Peer{Name: name, Addr: addr})
		return nil
	}}, "peer", "watchdog mode: another agent NODE=HOST:PORT (its --peer-listen) to ask whether anyone holds a lease while this one holds none (repeatable; docs/watchdog.md)")
	f.duration("heartbeat-interval", &a.HeartbeatInterval, "heartbeat interval until the coordinator sets one")
	f.duration("sample-interval", &a.SampleInterval, "signal sample interval until the coordinator sets one")
	fs.StringVar(&opts.reader.ProcRoot, "proc-root", signals.DefaultProcRoot, "where procfs is mounted")
	fs.StringVar(&opts.reader.CgroupRoot, "cgroup-root", signals.DefaultCgroupRoot, "where the cgroup filesystems are mounted")
	fs.Var(&value{name: "cgroup-version", text: "auto", errs: errs, set: func(s string) (err error) {
		opts.reader.CgroupVersion, err = signals.ParseCgroupVersion(s)
		return err
	}}, "cgroup-version", "cgroup hierarchy memory.available is read from: auto, 1 or 2")
	a.TLS.RegisterFlags(fs, "", "the coordinator connection")
	fs.Var(&value{name: "log-level", text: "info", errs: errs, set: func(s string) error {
		return opts.logLevel.UnmarshalText([]byte(s))
	}}, "log-level", "debug, info, warn or error")
}

// registerEviction registers kubelet's eviction flags and the agent's own pressure flags.
func (f *flags) registerEviction() {
	fs, opts, errs, ev := f.fs, f.opts, &f.errs, &f.ev
	ev.PressureTransitionPeriod = 5 * time.Minute
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
	fs.Var(&value{name: "eviction-hard", text: eviction.DefaultHard, errs: errs, set: func(s string) error {
		ev.HardSet = true
		return accumulate(&ev.Hard)(s)
	}}, "eviction-hard", "kubelet's hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10% (repeatable, as kubelet's); the agent evicts at once on its own node")
	fs.Var(&value{name: "eviction-soft", errs: errs, set: accumulate(&ev.Soft)}, "eviction-soft",
		"kubelet's soft eviction thresholds, e.g. memory.available<1.5Gi (repeatable); past their grace period the coordinator paces the evictions")
	fs.Var(&value{name: "eviction-soft-grace-period", errs: errs, set: accumulate(&ev.SoftGracePeriod)}, "eviction-soft-grace-period",
		"grace periods of the soft thresholds, e.g. memory.available=1m30s (repeatable)")
	fs.Var(&value{name: "eviction-minimum-reclaim", errs: errs, set: accumulate(&ev.MinimumReclaim)}, "eviction-minimum-reclaim",
		"minimum reclaims, e.g. memory.available=0Mi,nodefs.available=500Mi (repeatable)")
	fs.StringVar(&f.enforce, "enforce-node-allocatable", "pods", "kubelet's --enforce-node-allocatable: with \"pods\" in it (kubelet's default) the hard memory.available threshold is copied to allocatableMemory.available, measured on the pods' cgroup (kubepods)")
	fs.BoolVar(&opts.pressure.EvaluateDuringCleanup, "eviction-evaluate-during-cleanup", false, "keep reading the signals and reporting node conditions while an evicted pod's cleanup is waited for (up to 30s); default false, as kubelet, which evaluates nothing during that wait")
	fs.DurationVar(&opts.pressure.GrantTimeout, "eviction-grant-timeout", pressure.DefaultGrantTimeout,
		"how long a soft-threshold candidate waits for the coordinator's grant before the agent evicts it itself (coordinator unreachable)")
	f.duration("eviction-pressure-transition-period", &ev.PressureTransitionPeriod, "how long a pressure condition stays after its threshold stops being met")
	fs.Var(&value{name: "eviction-max-pod-grace-period", text: "0", errs: errs, set: func(s string) (err error) {
		ev.MaxPodGracePeriod, err = strconv.Atoi(s)
		return err
	}}, "eviction-max-pod-grace-period", "maximum pod grace period in seconds for soft evictions (0: evicted pods are killed at once, as kubelet does)")
	opts.pressure.HousekeepingInterval = pressure.DefaultHousekeepingInterval
	opts.pressure.FastInterval = pressure.DefaultFastInterval
	f.duration("housekeeping-interval", &opts.pressure.HousekeepingInterval, "how often every eviction signal is read and the thresholds evaluated (kubelet's)")
	opts.pressure.FastCeiling = pressure.DefaultFastCeiling
	f.duration("memory-fast-max-interval", &opts.pressure.FastCeiling, "longest wait between memory.available reads on the fast path: the detection bound when memory falls faster than expected")
	f.duration("memory-fast-interval", &opts.pressure.FastInterval, "shortest wait between memory.available reads on the fast path, which waits longer the further memory is from its thresholds (0 turns it off)")
	fs.StringVar(&opts.reader.FS.NodeFS, "nodefs-path", "", "a path on nodefs (default: --kubelet-root-dir, as kubelet's nodefs is its root dir's filesystem; when that does not exist, no filesystem signals); empty: no filesystem signals")
	fs.StringVar(&opts.reader.FS.ImageFS, "imagefs-path", "", "a path on imagefs, where the runtime keeps images (default: the runtime's image filesystem from CRI ImageFsInfo, else --nodefs-path)")
	fs.StringVar(&opts.reader.FS.ContainerFS, "containerfs-path", "", "a path on containerfs, where the runtime keeps writable layers (default: the runtime's container filesystem from CRI, else --imagefs-path)")
	fs.DurationVar(&opts.imageMinGCAge, "image-minimum-gc-age", cri.DefaultImageMinAge, "kubelet's --image-minimum-gc-age: an unused image is removed before evicting for disk pressure only once the agent has seen it this long")
	fs.StringVar(&opts.criEndpoint, "container-runtime-endpoint", cri.DefaultEndpoint, "kubelet's --container-runtime-endpoint (a unix socket): image filesystem discovery, writable layers for disk ranking, and dead containers and unused images freed before evicting for disk pressure; a socket that does not exist turns these off (logged); empty: off")
}

// registerNode registers graceful shutdown, Kubernetes mode and metrics.
func (f *flags) registerNode() {
	fs, opts, errs := f.fs, f.opts, &f.errs
	f.duration("shutdown-grace-period", &opts.shutdown.GracePeriod, "kubelet's shutdownGracePeriod: how long a node shutdown is delayed for pod termination (0 and 0 critical: off)")
	f.duration("shutdown-grace-period-critical-pods", &opts.shutdown.CriticalGracePeriod, "kubelet's shutdownGracePeriodCriticalPods: the part of --shutdown-grace-period kept for critical pods")
	fs.Var(&value{name: "shutdown-grace-period-by-pod-priority", errs: errs, set: func(s string) (err error) {
		opts.shutdown.ByPriority, err = shutdown.ParseByPriority(s)
		return err
	}}, "shutdown-grace-period-by-pod-priority", "kubelet's shutdownGracePeriodByPodPriority as priority:duration pairs, e.g. 100000:10s,10000:3m,0:1m")
	fs.StringVar(&opts.logindBus, "logind-bus", "", "D-Bus address logind is reached on (default: the system bus)")
	fs.BoolVar(&opts.manageInhibitDelay, "manage-inhibit-delay", true, "raise logind's InhibitDelayMaxSec to the shutdown grace period when it is lower, as kubelet does: write "+
		shutdown.DropInName+" to --logind-conf-dir and reload logind (false: only warn)")
	fs.StringVar(&opts.logindConfDir, "logind-conf-dir", shutdown.DefaultLogindConfDir, "the logind.conf.d directory --manage-inhibit-delay writes its drop-in to")
	fs.StringVar(&opts.kubeconfig, "kubeconfig", "", `Kubernetes mode: a kubeconfig path, or "in-cluster" inside a pod (default: standalone, no pods)`)
	fs.Var(&value{name: "cgroup-driver", text: "auto", errs: errs, set: func(s string) (err error) {
		opts.cgroupDriver, err = kubepods.ParseCgroupDriver(s)
		return err
	}}, "cgroup-driver", "the kubelet's --cgroup-driver, to find pod cgroups in Kubernetes mode: auto, cgroupfs or systemd")
	fs.StringVar(&opts.kubeletCgroupRoot, "kubelet-cgroup-root", "/", "the kubelet's --cgroup-root (cgroupRoot): the pods' cgroups, and the pods cgroup allocatableMemory.available is measured on, are under it")
	fs.StringVar(&opts.kubeletRootDir, "kubelet-root-dir", kubepods.DefaultKubeletRoot, "the kubelet's --root-dir, where Kubernetes mode measures pods' emptyDir volumes for disk ranking")
	fs.StringVar(&opts.podLogDir, "pod-log-dir", kubepods.DefaultPodLogDir, "where the kubelet keeps pod logs, measured for disk ranking in Kubernetes mode")
	fs.BoolVar(&opts.version, "version", false, "print the version and exit")
	fs.StringVar(&opts.metricsListen, "metrics-listen", "", "address to serve Prometheus /metrics on, e.g. 127.0.0.1:9811 (default: none)")
	fs.BoolVar(&opts.metricsTLS, "metrics-tls", false, server.MetricsTLSFlagHelp)
}

// resolveAgent completes the stream's configuration and checks it.
func (f *flags) resolveAgent() {
	if w := f.opts.watchdogTimeout; f.opts.watchdogDevice != "" && (w < time.Second || w > watchdog.MaxTimeout || w%time.Second != 0) {
		f.errs.add("--watchdog-timeout %s: want whole seconds from 1s to %s", w, watchdog.MaxTimeout)
	}
	if f.opts.watchdogDevice == "" && (f.opts.peerListen != "" || len(f.opts.peers) > 0) {
		f.errs.add("--peer-listen and --peer: only with --watchdog-device")
	}
	errs, a := &f.errs, &f.opts.agent
	for _, c := range strings.Split(f.coordinators, ",") {
		if c = strings.TrimSpace(c); c != "" {
			a.Coordinators = append(a.Coordinators, c)
		}
	}
	nodeName := f.nodeName
	if nodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			errs.add("--node-name: not set and the hostname is unknown: %v", err)
		}
		nodeName = strings.ToLower(host)
	}
	a.NodeName = nodeName
	if id, err := os.ReadFile(f.bootIDFile); err != nil {
		errs.add("--boot-id-file: %v", err)
	} else if a.BootID = strings.TrimSpace(string(id)); a.BootID == "" {
		errs.add("--boot-id-file: %s is empty", f.bootIDFile)
	}
	if f.opts.metricsTLS {
		if f.opts.metricsListen == "" {
			errs.add("--metrics-tls: needs --metrics-listen")
		}
		*errs = append(*errs, server.ValidateMetricsTLS(a.TLS)...)
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
			*errs = append(*errs, err)
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
}

// resolveEviction completes the eviction configuration and checks it.
func (f *flags) resolveEviction() {
	fs, opts, errs, ev := f.fs, f.opts, &f.errs, &f.ev
	for _, k := range strings.Split(f.enforce, ",") {
		switch strings.TrimSpace(k) {
		case "pods":
			ev.AllocatableMemory = true
			for _, c := range signals.DefaultPodsCgroups {
				opts.reader.PodsCgroups = append(opts.reader.PodsCgroups, path.Join(opts.kubeletCgroupRoot, c))
			}
		case "", "none", "system-reserved", "kube-reserved", "system-reserved-compressible", "kube-reserved-compressible":
		default:
			errs.add("--enforce-node-allocatable: %q: unknown key (want pods, system-reserved, kube-reserved, none)", k)
		}
	}
	if opts.pressure.GrantTimeout <= 0 {
		errs.add("--eviction-grant-timeout: %v: must be positive", opts.pressure.GrantTimeout)
	}
	nodefsSet := false
	fs.Visit(func(fl *flag.Flag) { nodefsSet = nodefsSet || fl.Name == "nodefs-path" })
	if !nodefsSet {
		// kubelet's nodefs is the filesystem of its --root-dir.
		opts.reader.FS.NodeFS = opts.kubeletRootDir
		if _, err := os.Stat(opts.kubeletRootDir); err != nil {
			opts.reader.FS.NodeFS = "" // no kubelet here: no filesystem signals (logged at start)
		}
	}
	var evErrs []error
	opts.eviction, evErrs = eviction.Parse(*ev)
	*errs = append(*errs, evErrs...)
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
}

// resolveNode checks the shutdown and Kubernetes mode configuration.
func (f *flags) resolveNode() {
	fs, opts, errs := f.fs, f.opts, &f.errs
	*errs = append(*errs, opts.shutdown.Validate()...)
	confDirSet := false
	fs.Visit(func(fl *flag.Flag) { confDirSet = confDirSet || fl.Name == "logind-conf-dir" })
	switch {
	case !opts.manageInhibitDelay && confDirSet:
		errs.add("--logind-conf-dir: has no effect with --manage-inhibit-delay=false")
	case opts.manageInhibitDelay && opts.logindConfDir == "":
		errs.add("--logind-conf-dir: must not be empty with --manage-inhibit-delay")
	case opts.manageInhibitDelay && !filepath.IsAbs(opts.logindConfDir):
		errs.add("--logind-conf-dir: %q: must be an absolute path", opts.logindConfDir)
	}
	for _, d := range []struct{ flag, dir string }{{"--kubelet-root-dir", opts.kubeletRootDir}, {"--pod-log-dir", opts.podLogDir}, {"--kubelet-cgroup-root", opts.kubeletCgroupRoot}} {
		if !filepath.IsAbs(d.dir) {
			errs.add("%s: %q: must be an absolute path", d.flag, d.dir)
		}
	}
}

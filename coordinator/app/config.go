package app

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/nodes"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wdlease"
)

// Config is the coordinator's configuration; every field is a flag.
type Config struct {
	// ID names this replica in the election; default hostname-pid.
	ID string
	// Advertise is the address other replicas hand to clients for this one; default the listen address.
	Advertise string
	// Server is the gRPC server configuration.
	Server server.Config
	// EtcdEndpoints are an external etcd cluster's client URLs; empty starts an embedded etcd.
	EtcdEndpoints []string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// EtcdClientListen and EtcdPeerListen are the embedded etcd's listen addresses.
	EtcdClientListen, EtcdPeerListen string
	// EtcdPrefix is the key prefix of all coordinator state.
	EtcdPrefix string
	// EtcdAccess is the TLS and user the coordinator presents to an external etcd.
	EtcdAccess EtcdAccess
	// Retention bounds the fence records and audit entries kept in etcd.
	Retention store.Retention
	// FenceConfig is the standalone YAML fence configuration file.
	FenceConfig string
	// Kubeconfig enables Kubernetes mode: a kubeconfig path, or "in-cluster".
	Kubeconfig string
	// KubeREST enables Kubernetes mode with a ready client configuration (tests).
	KubeREST *rest.Config
	// FenceNamespace holds the seed's fence ConfigMaps in Kubernetes mode.
	FenceNamespace string
	// FencePolicy is "stateful" (fence only nodes running StatefulSet pods or pods with
	// PersistentVolumeClaims, the seed's rule) or "all".
	FencePolicy string
	// DriverEndpoints map driver names to fence-driver services in Kubernetes mode (the standalone
	// YAML has its own drivers section): HOST:PORT, or several comma-separated, tried in order while
	// one is unreachable (fenceconfig.Driver.Endpoints).
	DriverEndpoints map[string]string
	// DriverIdentities map driver names to the identity name each driver's certificate must carry
	// (spiffe://nodefence/driver/<name>) in Kubernetes mode; a driver not named here must present
	// its own name (driver/ipmi for ipmi).
	DriverIdentities map[string]string
	// Engine holds the node lifecycle parameters (grace periods, eviction rates, zone thresholds).
	Engine engine.Config
	// ElectionTTL is the leader lease: a dead leader is replaced after at most this long.
	ElectionTTL time.Duration
	// FenceOpTimeout bounds one driver call including its read-back.
	FenceOpTimeout time.Duration
	// DeviceCheckInterval is how often the leader checks every fence method's device with the
	// driver's Monitor (non-destructive); 0 turns the checks off.
	DeviceCheckInterval time.Duration
	// Fencing is the fence flow's retry, wait and polling policy.
	Fencing fencing.Policy
	// AgentHeartbeatInterval and AgentSampleInterval are sent to agents.
	AgentHeartbeatInterval, AgentSampleInterval time.Duration
	// WatchdogLease is the watchdog lease the leader grants an agent with each heartbeat that asks
	// for one (services/wdlease): more than three heartbeat intervals, so that a majority's holding
	// stays provable between renewals, and at most wdlease.MaxGrant; 0 means
	// DefaultWatchdogLeaseHeartbeats of them (at most wdlease.MaxGrant).
	WatchdogLease time.Duration
	// AdmissionListen is the HTTPS IP:PORT of the admission webhook that checks the node agents'
	// evictions and Events against the node their token names (Kubernetes mode; "" turns it off).
	AdmissionListen string
	// AdmissionAgentUser is the agents' ServiceAccount user the webhook judges.
	AdmissionAgentUser string
	// KdumpListen is the UDP IP:PORT for fence_kdump messages: an explicit address, never all
	// interfaces ("" disables the listener, the default).
	KdumpListen string
	// DriverTLS secures connections to fence-driver services.
	DriverTLS tlsfiles.Files
	// EtcdUnsafeNoFsync disables fsync in the embedded etcd (tests and demos only).
	EtcdUnsafeNoFsync bool
	// EtcdQuotaBackendBytes is the embedded etcd's database quota (its NOSPACE alarm); 0 is
	// etcd's default.
	EtcdQuotaBackendBytes int64
	// PodEvictionTimeout is accepted for old command lines and ignored, with a warning: Kubernetes
	// removed --pod-eviction-timeout in 1.27 (taint-based eviction replaced it).
	PodEvictionTimeout time.Duration
	// ControlPlaneSelector selects the control-plane nodes (Kubernetes mode): never fenced
	// automatically unless Engine.Fence.AllowControlPlane, and never the last ready one.
	ControlPlaneSelector string
	// ReleaseHealthyDelay is how long a fenced node must be back (Ready, agent reporting) before its
	// out-of-service taint is removed (Kubernetes mode): one healthy moment of a flapping node is
	// not enough.
	ReleaseHealthyDelay time.Duration
	// GCPercent is the garbage-collection target (Go's GOGC) the coordinator binary sets for its
	// process; see gctune.Apply. The default, 200, keeps collections (each of which slows ingest for
	// about 100 ms on two cores) three times rarer than Go's 100, for about 30% more memory: RSS
	// about 530 MB instead of 420 MB at 10,000 agents sending 50,000 samples a second.
	GCPercent int
	// Now is the one clock of everything the app runs (see clock.go); nil means time.Now.
	Now func() time.Time
	// After waits on Now's clock (see clock.go); nil waits on the machine's timers, which is right
	// for a Now that runs at the machine's rate. A test that moves Now by hand gives both.
	After func(time.Duration) <-chan time.Time
}

// Defaults of the coordinator's own settings. DefaultConfig gathers them with the engine's
// (engine.DefaultConfig), the fence flow's (fencing.DefaultPolicy) and the history retention's
// (store.DefaultRetention): the flags and SetDefaults both take their defaults from it.
const (
	DefaultListen           = "127.0.0.1:7001"
	DefaultDataDir          = "nodefence-data"
	DefaultEtcdClientListen = "127.0.0.1:2379"
	DefaultEtcdPeerListen   = "127.0.0.1:2380"
	DefaultEtcdPrefix       = "/nodefence"
	DefaultFenceNamespace   = "nodefence"
	DefaultFencePolicy      = "stateful"
	DefaultElectionTTL      = 5 * time.Second
	DefaultFenceOpTimeout   = 30 * time.Second
	// DefaultDeviceCheckInterval is how often fence devices are checked; 0 would turn checks off.
	DefaultDeviceCheckInterval    = 5 * time.Minute
	DefaultAgentHeartbeatInterval = time.Second
	DefaultAgentSampleInterval    = time.Second
	// DefaultWatchdogLeaseHeartbeats is WatchdogLease's default in heartbeat intervals (4 s with
	// the default heartbeat, wdlease.DefaultLease).
	DefaultWatchdogLeaseHeartbeats = 4
	DefaultGCPercent               = 200
	// DefaultControlPlaneSelector selects the nodes kubeadm and most installers label control plane.
	DefaultControlPlaneSelector = "node-role.kubernetes.io/control-plane"
	// DefaultReleaseHealthyDelay is ReleaseHealthyDelay's default (medik8s NHC's healthyDelay is
	// of the same order).
	DefaultReleaseHealthyDelay = time.Minute
)

// Bounds Validate enforces.
const (
	minGCPercent, maxGCPercent = 50, 1000
	maxFenceRetries            = 100
)

// DefaultConfig is every default of the coordinator's configuration, in one place. ID (hostname-pid)
// is filled by SetDefaults; the server's defaults are server.Config's own.
func DefaultConfig() Config {
	eng := engine.DefaultConfig()
	eng.Fence.FlapWindow = DefaultReleaseHealthyDelay
	return Config{
		DataDir: DefaultDataDir, EtcdClientListen: DefaultEtcdClientListen, EtcdPeerListen: DefaultEtcdPeerListen,
		EtcdPrefix: DefaultEtcdPrefix, Retention: store.DefaultRetention(),
		FenceNamespace: DefaultFenceNamespace, FencePolicy: DefaultFencePolicy,
		Engine:      eng,
		ElectionTTL: DefaultElectionTTL, FenceOpTimeout: DefaultFenceOpTimeout, DeviceCheckInterval: DefaultDeviceCheckInterval,
		Fencing:                fencing.DefaultPolicy(),
		AgentHeartbeatInterval: DefaultAgentHeartbeatInterval, AgentSampleInterval: DefaultAgentSampleInterval,
		ControlPlaneSelector: DefaultControlPlaneSelector, ReleaseHealthyDelay: DefaultReleaseHealthyDelay,
		GCPercent: DefaultGCPercent, AdmissionAgentUser: DefaultAdmissionAgentUser,
	}
}

// RegisterFlags binds every field to a flag, with DefaultConfig's values as the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := DefaultConfig()
	c.Server.RegisterFlags(fs, DefaultListen)
	fs.StringVar(&c.ID, "id", c.ID, "replica id in the leader election (default hostname-pid)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "address clients should use for this replica (default --listen)")
	c.registerEtcdFlags(fs, d)
	c.registerKubeFlags(fs, d)
	c.registerEngineFlags(fs, d.Engine)
	c.registerFenceFlags(fs, d)
	fs.DurationVar(&c.ElectionTTL, "election-ttl", d.ElectionTTL, "leader lease TTL (whole seconds)")
	fs.DurationVar(&c.AgentHeartbeatInterval, "agent-heartbeat-interval", d.AgentHeartbeatInterval, "heartbeat interval sent to agents")
	fs.DurationVar(&c.AgentSampleInterval, "agent-sample-interval", d.AgentSampleInterval, "sample interval sent to agents")
	fs.DurationVar(&c.WatchdogLease, "watchdog-lease", 0, "the watchdog lease granted to agents that keep a watchdog, renewed with each heartbeat; more than 3 heartbeat intervals (default 4 heartbeat intervals; docs/watchdog.md)")
	fs.IntVar(&c.GCPercent, "gc-percent", d.GCPercent, "garbage-collection target (GOGC; the GOGC variable wins), 50..1000; the soft memory limit is 90% of the container's")
}

// registerEtcdFlags binds the etcd, embedded etcd and history retention flags.
func (c *Config) registerEtcdFlags(fs *flag.FlagSet, d Config) {
	fs.Func("etcd-endpoints", "comma-separated etcd client URLs; empty starts an embedded etcd", func(s string) error {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.EtcdEndpoints = append(c.EtcdEndpoints, e)
			}
		}
		return nil
	})
	fs.StringVar(&c.DataDir, "data-dir", d.DataDir, "embedded etcd data directory")
	fs.StringVar(&c.EtcdClientListen, "etcd-client-listen", d.EtcdClientListen, "embedded etcd client address")
	fs.StringVar(&c.EtcdPeerListen, "etcd-peer-listen", d.EtcdPeerListen, "embedded etcd peer address")
	fs.StringVar(&c.EtcdPrefix, "etcd-prefix", d.EtcdPrefix, "etcd key prefix")
	fs.BoolVar(&c.EtcdUnsafeNoFsync, "etcd-unsafe-no-fsync", false, "embedded etcd without fsync (tests and demos only)")
	c.EtcdAccess.RegisterFlags(fs)
	r := d.Retention
	fs.DurationVar(&c.Retention.FenceMaxAge, "fence-history-max-age", r.FenceMaxAge, "delete finished fence records older than this (0: no age limit)")
	fs.IntVar(&c.Retention.FenceMaxRecords, "fence-history-max-records", r.FenceMaxRecords, "keep at most this many fence records, deleting the oldest finished ones (0: no limit)")
	fs.DurationVar(&c.Retention.AuditMaxAge, "audit-max-age", r.AuditMaxAge, "delete audit entries older than this (0: no age limit)")
	fs.IntVar(&c.Retention.AuditMaxEntries, "audit-max-entries", r.AuditMaxEntries, "keep at most this many audit entries (0: no limit)")
}

// registerKubeFlags binds the fence configuration's source and the Kubernetes mode's flags.
func (c *Config) registerKubeFlags(fs *flag.FlagSet, d Config) {
	fs.StringVar(&c.FenceConfig, "config", "", "standalone fence configuration (YAML)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", `kubeconfig for Kubernetes mode ("in-cluster" inside a pod)`)
	fs.StringVar(&c.FenceNamespace, "fence-namespace", d.FenceNamespace, "namespace of the fence ConfigMaps (Kubernetes mode)")
	fs.StringVar(&c.FencePolicy, "fence-policy", d.FencePolicy, "which nodes are fenced automatically in Kubernetes mode: stateful or all")
	fs.Func("driver-endpoint", "NAME=HOST:PORT[,HOST:PORT...] of a fence-driver service, several addresses tried in order (Kubernetes mode; repeatable)", func(v string) error {
		name, addr, ok := strings.Cut(v, "=")
		if !ok || name == "" || addr == "" {
			return fmt.Errorf("want NAME=HOST:PORT, got %q", v)
		}
		if c.DriverEndpoints == nil {
			c.DriverEndpoints = map[string]string{}
		}
		c.DriverEndpoints[name] = addr
		return nil
	})
	fs.Func("driver-identity", "NAME=IDENTITY: the driver NAME's service must present spiffe://nodefence/driver/IDENTITY (Kubernetes mode; repeatable; default: driver/NAME)", func(v string) error {
		name, id, ok := strings.Cut(v, "=")
		if !ok || name == "" || id == "" {
			return fmt.Errorf("want NAME=IDENTITY, got %q", v)
		}
		if c.DriverIdentities == nil {
			c.DriverIdentities = map[string]string{}
		}
		c.DriverIdentities[name] = id
		return nil
	})
	fs.StringVar(&c.ControlPlaneSelector, "control-plane-selector", d.ControlPlaneSelector, "label selector of control-plane nodes (Kubernetes mode)")
	fs.StringVar(&c.AdmissionListen, "admission-listen", "", "IP:PORT of the HTTPS admission webhook (--tls-cert, --tls-key) that admits a node agent's eviction or Event only for its own node's pods and Node (Kubernetes mode; default off)")
	fs.StringVar(&c.AdmissionAgentUser, "admission-agent-user", d.AdmissionAgentUser, "the node agents' ServiceAccount user the admission webhook judges")
	fs.DurationVar(&c.ReleaseHealthyDelay, "release-healthy-delay", d.ReleaseHealthyDelay, "how long a fenced node must be back and Ready before its out-of-service taint is removed (Kubernetes mode)")
}

// registerEngineFlags binds the node lifecycle's flags (kube-controller-manager's names) and the
// pod-eviction pacing's.
func (c *Config) registerEngineFlags(fs *flag.FlagSet, d engine.Config) {
	c.Engine = d // the settings without a flag keep their defaults
	fs.DurationVar(&c.Engine.NodeMonitorGracePeriod, "node-monitor-grace-period", d.NodeMonitorGracePeriod, "silence after which a node that reported is Unknown")
	fs.DurationVar(&c.Engine.NodeStartupGracePeriod, "node-startup-grace-period", d.NodeStartupGracePeriod, "silence after which a node that never reported is Unknown")
	fs.DurationVar(&c.PodEvictionTimeout, "pod-eviction-timeout", 0, "DEPRECATED, no effect: removed from Kubernetes in 1.27; taint-based eviction (tolerationSeconds) decides when pods leave a not-ready node")
	fs.Float64Var(&c.Engine.NodeEvictionRate, "node-eviction-rate", d.NodeEvictionRate, "nodes per second released from a Normal or FullDisruption zone")
	fs.Float64Var(&c.Engine.SecondaryNodeEvictionRate, "secondary-node-eviction-rate", d.SecondaryNodeEvictionRate, "nodes per second released from a large PartialDisruption zone")
	fs.IntVar(&c.Engine.LargeClusterSizeThreshold, "large-cluster-size-threshold", d.LargeClusterSizeThreshold, "zone size above which a PartialDisruption zone keeps the secondary rate")
	fs.Float64Var(&c.Engine.UnhealthyZoneThreshold, "unhealthy-zone-threshold", d.UnhealthyZoneThreshold, "not-ready fraction that makes a zone PartialDisruption")
	fs.Float64Var(&c.Engine.PodEviction.Rate, "pod-eviction-rate", d.PodEviction.Rate, "soft-threshold pod evictions granted per second per zone (token bucket; 0: none, agents fall back to local evictions)")
	fs.IntVar(&c.Engine.PodEviction.Burst, "pod-eviction-burst", d.PodEviction.Burst, "pod-eviction grants a zone may give at once")
	fs.IntVar(&c.Engine.PodEviction.MaxInFlight, "pod-eviction-max-in-flight", d.PodEviction.MaxInFlight, "granted pod evictions per zone whose outcome the agent has not reported yet")
	fs.DurationVar(&c.Engine.PodEviction.GrantTTL, "pod-eviction-grant-ttl", d.PodEviction.GrantTTL, "how long a grant without the agent's report counts as in flight")
	fs.Func("kubelet-down-policy", `what a silent kubelet means while the node's agent reports (Kubernetes mode): "wait" (never fence; default) or "fence"`, func(v string) error {
		p, err := nodes.ParseKubeletDownPolicy(v)
		c.Engine.KubeletDownPolicy = p
		return err
	})
	fs.Func("unhealthy-condition", "TYPE=STATUS:DURATION (repeatable, Kubernetes mode): a node whose agent and kubelet report but whose Node has this condition for this long is power-cycled (off, confirmed by read-back, then on; its pods are not released), as KernelDeadlock=True:5m", func(v string) error {
		t, err := engine.ParseConditionTrigger(v)
		if err == nil {
			c.Engine.UnhealthyConditions = append(c.Engine.UnhealthyConditions, t)
		}
		return err
	})
}

// registerFenceFlags binds the automatic trigger's, the storm guard's and the fence flow's flags.
func (c *Config) registerFenceFlags(fs *flag.FlagSet, d Config) {
	fs.StringVar(&c.KdumpListen, "kdump-listen", "", "IP:PORT (an explicit address, never all interfaces) for fence_kdump_send messages; default off")
	fs.DurationVar(&c.Engine.KdumpIdle, "kdump-idle", d.Engine.KdumpIdle, "a node is dumping while its fence_kdump messages are at most this far apart")
	fs.DurationVar(&c.Engine.KdumpTimeout, "kdump-timeout", d.Engine.KdumpTimeout, "longest wait of power management for a kernel dump")
	f := d.Engine.Fence
	fs.BoolVar(&c.Engine.Fence.Enabled, "auto-fence", f.Enabled, "fence not-ready nodes automatically (manual fencing is always available)")
	fs.DurationVar(&c.Engine.Fence.Timeout, "fence-timeout", f.Timeout, "how long a node must stay a fence candidate before it is fenced: counted from both witnesses silent past their windows (--fence-detect witnesses) or from its release (grace)")
	fs.Float64Var(&c.Engine.Fence.MaxUnresponsivePercent, "max-unresponsive-percent", f.MaxUnresponsivePercent, "no automatic fencing while more than this % of the cluster or zone is not ready (0: no limit)")
	fs.IntVar(&c.Engine.Fence.Budget, "fence-budget", f.Budget, "automatic fences per zone per --fence-budget-window (0: no budget)")
	fs.DurationVar(&c.Engine.Fence.BudgetWindow, "fence-budget-window", f.BudgetWindow, "window of --fence-budget")
	fs.DurationVar(&c.Engine.Fence.Settle, "fence-guard-settle", f.Settle, "how long the storm guard must let a released node's fence pass, without a break, before it is requested")
	fs.DurationVar(&c.Engine.Fence.StormCooldown, "storm-cooldown", f.StormCooldown, "keep automatic fencing held back this long after the storm guard last held a fence back for a storm (0: off)")
	fs.BoolVar(&c.Engine.Fence.AllowControlPlane, "fence-control-plane", f.AllowControlPlane, "fence nodes matching --control-plane-selector automatically (one at a time, never the last ready one, never against a majority of them)")
	fs.Func("fence-mode", `"enforce" (default): automatic decisions fence; "observe": every decision is made, recorded and counted as would fence / would release, and nothing is switched, tainted or deleted (see docs/observe.md)`, func(v string) error {
		m, err := engine.ParseFenceMode(v)
		c.Engine.Fence.Mode = m
		return err
	})
	fs.Func("fence-detect", `what starts the fence clock in Kubernetes mode: "witnesses" (default): the node's agent and its kubelet both silent past their own windows (3 heartbeats + 1s; 2 Lease renewals + 2s); "grace": not ready past --node-monitor-grace-period and released by the zone's pacing, as kube-controller-manager would evict (standalone mode always uses grace)`, func(v string) error {
		m, err := engine.ParseFenceDetect(v)
		c.Engine.Fence.Detect = m
		return err
	})
	fs.DurationVar(&c.FenceOpTimeout, "fence-op-timeout", d.FenceOpTimeout, "deadline of one driver call including read-back")
	fs.DurationVar(&c.DeviceCheckInterval, "device-check-interval", d.DeviceCheckInterval, "how often the leader checks every fence device with the driver's Monitor (0: never)")
	p := d.Fencing
	fs.IntVar(&c.Fencing.Retries, "fence-retries", p.Retries, "retries of a failed fence record before it is escalated")
	fs.DurationVar(&c.Fencing.Backoff, "fence-retry-backoff", p.Backoff, "delay before the first retry; doubles each retry")
	fs.DurationVar(&c.Fencing.IsolationWait, "isolation-wait", p.IsolationWait, "after isolation, how long the node may recover before power management")
	fs.IntVar(&c.Fencing.Polls, "power-management-polls", p.Polls, "readiness polls after a power cycle before the record is an error")
	fs.DurationVar(&c.Fencing.PollInterval, "power-management-poll-interval", p.PollInterval, "interval of those polls")
	fs.DurationVar(&c.Fencing.PowerWait, "reboot-power-wait", p.PowerWait, "a reboot's wait between its confirmed power-off and its power-on (fence-agents' power_wait)")
	c.DriverTLS.RegisterFlags(fs, "driver-", "fence-driver connections")
}

// SetDefaults fills zero fields with DefaultConfig's values (Engine, Retention and Fencing as a
// whole when entirely zero). Fields whose zero is a choice (DeviceCheckInterval: no checks) or
// that must be given (DataDir for the embedded etcd) are left alone.
func (c *Config) SetDefaults() {
	d := DefaultConfig()
	c.Server.SetDefaults()
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	setDefault(&c.EtcdPrefix, d.EtcdPrefix)
	if c.Retention == (store.Retention{}) {
		c.Retention = d.Retention
	}
	if reflect.ValueOf(c.Engine).IsZero() {
		c.Engine = d.Engine
	}
	c.Engine.SetDefaults()
	setDefault(&c.FenceNamespace, d.FenceNamespace)
	setDefault(&c.FencePolicy, d.FencePolicy)
	setDefault(&c.ElectionTTL, d.ElectionTTL)
	setDefault(&c.FenceOpTimeout, d.FenceOpTimeout)
	if c.Fencing == (fencing.Policy{}) {
		c.Fencing = d.Fencing
	}
	setDefault(&c.AgentHeartbeatInterval, d.AgentHeartbeatInterval)
	setDefault(&c.AgentSampleInterval, d.AgentSampleInterval)
	setDefault(&c.GCPercent, d.GCPercent)
	setDefault(&c.ControlPlaneSelector, d.ControlPlaneSelector)
	setDefault(&c.ReleaseHealthyDelay, d.ReleaseHealthyDelay)
	// A node that comes back and dies again within the healthy delay keeps its earlier evidence.
	c.Engine.Fence.FlapWindow = c.ReleaseHealthyDelay
	setDefault(&c.AdmissionAgentUser, d.AdmissionAgentUser)
	c.Engine.KubeletWitness = c.kubeMode()
}

// setDefault sets *v to def when *v is zero.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate returns every problem with the configuration, each naming its flag.
func (c *Config) Validate() []error {
	errs := c.Server.Validate()
	errs = append(errs, c.validateSources()...)
	errs = append(errs, c.EtcdAccess.Validate(len(c.EtcdEndpoints) > 0)...)
	errs = append(errs, c.validateEtcd()...)
	errs = append(errs, c.validateEngine()...)
	errs = append(errs, c.validateFencing()...)
	errs = append(errs, c.validateAdmission()...)
	return append(errs, c.DriverTLS.Validate("driver-", false)...)
}

// validateSources checks where the fence configuration comes from and the Kubernetes mode's flags.
func (c *Config) validateSources() []error {
	var errs []error
	if !c.kubeMode() && c.FenceConfig == "" {
		errs = append(errs, errors.New("--config: a fence configuration file is required in standalone mode (or --kubeconfig)"))
	}
	if c.FencePolicy != "" && c.FencePolicy != "stateful" && c.FencePolicy != "all" {
		errs = append(errs, fmt.Errorf("--fence-policy: %q is not stateful or all", c.FencePolicy))
	}
	for _, name := range slices.Sorted(maps.Keys(c.DriverEndpoints)) {
		addrs := strings.Split(c.DriverEndpoints[name], ",")
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				errs = append(errs, fmt.Errorf("--driver-endpoint %s: %q is not host:port", name, a))
			}
		}
		if len(addrs) > fenceconfig.MaxEndpoints {
			errs = append(errs, fmt.Errorf("--driver-endpoint %s: %d addresses, at most %d", name, len(addrs), fenceconfig.MaxEndpoints))
		}
		d := fenceconfig.Driver{Identity: c.DriverIdentities[name]}
		if err := identity.ValidName(d.PeerName(name)); err != nil {
			errs = append(errs, fmt.Errorf("--driver-identity %s: %s is not a valid identity name (%v)", name, d.PeerName(name), err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.DriverIdentities)) {
		if _, ok := c.DriverEndpoints[name]; !ok {
			errs = append(errs, fmt.Errorf("--driver-identity %s: no --driver-endpoint %s=HOST:PORT", name, name))
		}
	}
	if _, err := labels.Parse(c.ControlPlaneSelector); err != nil {
		errs = append(errs, fmt.Errorf("--control-plane-selector: %w", err))
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			errs = append(errs, fmt.Errorf("--advertise: %q is not host:port", c.Advertise))
		}
	}
	if c.GCPercent < minGCPercent || c.GCPercent > maxGCPercent {
		errs = append(errs, fmt.Errorf("--gc-percent: %d is not in %d..%d", c.GCPercent, minGCPercent, maxGCPercent))
	}
	return errs
}

// validateEtcd checks the etcd, election and retention settings.
func (c *Config) validateEtcd() []error {
	var errs []error
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: required for the embedded etcd"))
	}
	if !strings.HasPrefix(c.EtcdPrefix, "/") || strings.HasSuffix(c.EtcdPrefix, "/") {
		errs = append(errs, fmt.Errorf("--etcd-prefix: %q must start and not end with /", c.EtcdPrefix))
	}
	if c.ElectionTTL < time.Second || c.ElectionTTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--election-ttl: %s must be a whole number of seconds, at least 1s", c.ElectionTTL))
	}
	r := c.Retention
	errs = appendNegative(errs, "fence-history-max-age", r.FenceMaxAge < 0)
	errs = appendNegative(errs, "fence-history-max-records", r.FenceMaxRecords < 0)
	errs = appendNegative(errs, "audit-max-age", r.AuditMaxAge < 0)
	return appendNegative(errs, "audit-max-entries", r.AuditMaxEntries < 0)
}

// validateEngine checks the node lifecycle and pod-eviction settings.
func (c *Config) validateEngine() []error {
	var errs []error
	e := c.Engine
	errs = appendNotPositive(errs, "node-monitor-grace-period", e.NodeMonitorGracePeriod <= 0)
	errs = appendNotPositive(errs, "node-startup-grace-period", e.NodeStartupGracePeriod <= 0)
	if e.UnhealthyZoneThreshold <= 0 || e.UnhealthyZoneThreshold > 1 {
		errs = append(errs, fmt.Errorf("--unhealthy-zone-threshold: %v is not in (0, 1]", e.UnhealthyZoneThreshold))
	}
	errs = appendNegative(errs, "node-eviction-rate", e.NodeEvictionRate < 0)
	errs = appendNegative(errs, "secondary-node-eviction-rate", e.SecondaryNodeEvictionRate < 0)
	errs = appendNegative(errs, "large-cluster-size-threshold", e.LargeClusterSizeThreshold < 0)
	errs = appendNegative(errs, "pod-eviction-rate", e.PodEviction.Rate < 0)
	errs = appendNotPositive(errs, "pod-eviction-burst", e.PodEviction.Burst < 1)
	errs = appendNotPositive(errs, "pod-eviction-max-in-flight", e.PodEviction.MaxInFlight < 1)
	errs = appendNotPositive(errs, "pod-eviction-grant-ttl", e.PodEviction.GrantTTL <= 0)
	errs = appendNotPositive(errs, "agent-heartbeat-interval", c.AgentHeartbeatInterval <= 0)
	if l := c.WatchdogLease; l != 0 && (l <= 3*c.AgentHeartbeatInterval || l > wdlease.MaxGrant) {
		errs = append(errs, fmt.Errorf("--watchdog-lease: %s is not more than 3 heartbeat intervals (%s) and at most %s (the longest an agent takes)", l, 3*c.AgentHeartbeatInterval, wdlease.MaxGrant))
	}
	return appendNotPositive(errs, "agent-sample-interval", c.AgentSampleInterval <= 0)
}

// validateFencing checks the automatic trigger, the storm guard and the fence flow's settings.
func (c *Config) validateFencing() []error {
	var errs []error
	f, p := c.Engine.Fence, c.Fencing
	errs = appendNegative(errs, "fence-timeout", f.Timeout < 0)
	errs = appendNegative(errs, "fence-budget", f.Budget < 0)
	errs = appendNotPositive(errs, "fence-budget-window", f.BudgetWindow <= 0)
	errs = appendNegative(errs, "fence-guard-settle", f.Settle < 0)
	errs = appendNegative(errs, "storm-cooldown", f.StormCooldown < 0)
	if err := engine.ValidateConditionTriggers(c.Engine.UnhealthyConditions); err != nil {
		errs = append(errs, fmt.Errorf("--unhealthy-condition: %w", err))
	}
	if f.MaxUnresponsivePercent < 0 || f.MaxUnresponsivePercent > 100 {
		errs = append(errs, fmt.Errorf("--max-unresponsive-percent: %v is not in 0..100", f.MaxUnresponsivePercent))
	}
	errs = appendNegative(errs, "release-healthy-delay", c.ReleaseHealthyDelay < 0)
	errs = appendNegative(errs, "device-check-interval", c.DeviceCheckInterval < 0)
	errs = appendNotPositive(errs, "fence-op-timeout", c.FenceOpTimeout <= 0)
	if p.Retries < 0 || p.Retries > maxFenceRetries {
		errs = append(errs, fmt.Errorf("--fence-retries: %d is not in 0..%d", p.Retries, maxFenceRetries))
	}
	errs = appendNotPositive(errs, "fence-retry-backoff", p.Backoff <= 0)
	errs = appendNegative(errs, "isolation-wait", p.IsolationWait < 0)
	errs = appendNegative(errs, "reboot-power-wait", p.PowerWait < 0)
	errs = appendNegative(errs, "power-management-polls", p.Polls < 0)
	return appendNotPositive(errs, "power-management-poll-interval", p.PollInterval <= 0)
}

// appendNegative adds "--flag: must not be negative" when bad.
func appendNegative(errs []error, flag string, bad bool) []error {
	if bad {
		errs = append(errs, fmt.Errorf("--%s: must not be negative", flag))
	}
	return errs
}

// appendNotPositive adds "--flag: must be positive" when bad.
func appendNotPositive(errs []error, flag string, bad bool) []error {
	if bad {
		errs = append(errs, fmt.Errorf("--%s: must be positive", flag))
	}
	return errs
}

func (c *Config) kubeMode() bool { return c.Kubeconfig != "" || c.KubeREST != nil }

func (c *Config) driverMap() map[string]fenceconfig.Driver {
	m := map[string]fenceconfig.Driver{}
	for name, addr := range c.DriverEndpoints {
		addrs := strings.Split(addr, ",")
		m[name] = fenceconfig.Driver{Endpoint: addrs[0], Endpoints: addrs[1:], Identity: c.DriverIdentities[name]}
	}
	return m
}

// watchdogLease is WatchdogLease in force: when 0, DefaultWatchdogLeaseHeartbeats heartbeat
// intervals, at most the longest lease an agent takes.
func (c *Config) watchdogLease() time.Duration {
	if c.WatchdogLease == 0 {
		return min(DefaultWatchdogLeaseHeartbeats*c.AgentHeartbeatInterval, wdlease.MaxGrant)
	}
	return c.WatchdogLease
}

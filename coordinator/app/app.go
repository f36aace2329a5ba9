// Package app wires the coordinator: etcd (embedded or external), the gRPC server, the election loop,
// and per term the engine loop, the fence runner, the device checks, the fence history's upkeep and,
// in Kubernetes mode, the Kubernetes mirror. main and the tests both run it.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kdump"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/nodes"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
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
	// YAML has its own drivers section).
	DriverEndpoints map[string]string
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
	// KdumpListen is the UDP IP:PORT for fence_kdump messages: an explicit address, never all
	// interfaces ("" disables the listener, the default).
	KdumpListen string
	// DriverTLS secures connections to fence-driver services.
	DriverTLS tlsfiles.Files
	// EtcdUnsafeNoFsync disables fsync in the embedded etcd (tests and demos only).
	EtcdUnsafeNoFsync bool
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
	// process; see cli.ApplyGC. The default, 200, keeps collections (each of which slows ingest for
	// about 100 ms on two cores) three times rarer than Go's 100, for about 30% more memory: RSS
	// about 530 MB instead of 420 MB at 10,000 agents sending 50,000 samples a second.
	GCPercent int
}

// RegisterFlags binds every field to a flag.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.Server.RegisterFlags(fs, "127.0.0.1:7001")
	fs.StringVar(&c.ID, "id", c.ID, "replica id in the leader election (default hostname-pid)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "address clients should use for this replica (default --listen)")
	fs.Func("etcd-endpoints", "comma-separated etcd client URLs; empty starts an embedded etcd", func(s string) error {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.EtcdEndpoints = append(c.EtcdEndpoints, e)
			}
		}
		return nil
	})
	fs.StringVar(&c.DataDir, "data-dir", "nodefence-data", "embedded etcd data directory")
	fs.StringVar(&c.EtcdClientListen, "etcd-client-listen", "127.0.0.1:2379", "embedded etcd client address")
	fs.StringVar(&c.EtcdPeerListen, "etcd-peer-listen", "127.0.0.1:2380", "embedded etcd peer address")
	fs.StringVar(&c.EtcdPrefix, "etcd-prefix", "/nodefence", "etcd key prefix")
	c.EtcdAccess.RegisterFlags(fs)
	c.registerRetentionFlags(fs)
	fs.StringVar(&c.FenceConfig, "config", "", "standalone fence configuration (YAML)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", `kubeconfig for Kubernetes mode ("in-cluster" inside a pod)`)
	fs.StringVar(&c.FenceNamespace, "fence-namespace", "nodefence", "namespace of the fence ConfigMaps (Kubernetes mode)")
	fs.StringVar(&c.FencePolicy, "fence-policy", "stateful", "which nodes are fenced automatically in Kubernetes mode: stateful or all")
	fs.Func("driver-endpoint", "NAME=HOST:PORT of a fence-driver service (Kubernetes mode; repeatable)", func(v string) error {
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
	fs.DurationVar(&c.Engine.NodeMonitorGracePeriod, "node-monitor-grace-period", engine.DefaultNodeMonitorGracePeriod, "silence after which a node that reported is Unknown")
	fs.DurationVar(&c.Engine.NodeStartupGracePeriod, "node-startup-grace-period", engine.DefaultNodeStartupGracePeriod, "silence after which a node that never reported is Unknown")
	fs.DurationVar(&c.PodEvictionTimeout, "pod-eviction-timeout", 0, "DEPRECATED, no effect: removed from Kubernetes in 1.27; taint-based eviction (tolerationSeconds) decides when pods leave a not-ready node")
	fs.Float64Var(&c.Engine.NodeEvictionRate, "node-eviction-rate", 0.1, "nodes per second released from a Normal or FullDisruption zone")
	fs.Float64Var(&c.Engine.SecondaryNodeEvictionRate, "secondary-node-eviction-rate", 0.01, "nodes per second released from a large PartialDisruption zone")
	fs.IntVar(&c.Engine.LargeClusterSizeThreshold, "large-cluster-size-threshold", 50, "zone size above which a PartialDisruption zone keeps the secondary rate")
	fs.Float64Var(&c.Engine.UnhealthyZoneThreshold, "unhealthy-zone-threshold", 0.55, "not-ready fraction that makes a zone PartialDisruption")
	defEng := engine.DefaultConfig()
	fs.Float64Var(&c.Engine.PodEviction.Rate, "pod-eviction-rate", engine.DefaultPodEvictionRate, "soft-threshold pod evictions granted per second per zone (token bucket; 0: none, agents fall back to local evictions)")
	fs.IntVar(&c.Engine.PodEviction.Burst, "pod-eviction-burst", engine.DefaultPodEvictionBurst, "pod-eviction grants a zone may give at once")
	fs.IntVar(&c.Engine.PodEviction.MaxInFlight, "pod-eviction-max-in-flight", engine.DefaultPodEvictionMaxInFlight, "granted pod evictions per zone whose outcome the agent has not reported yet")
	fs.DurationVar(&c.Engine.PodEviction.GrantTTL, "pod-eviction-grant-ttl", engine.DefaultPodEvictionGrantTTL, "how long a grant without the agent's report counts as in flight")
	fs.StringVar(&c.KdumpListen, "kdump-listen", "", "IP:PORT (an explicit address, never all interfaces) for fence_kdump_send messages; default off")
	fs.DurationVar(&c.Engine.KdumpIdle, "kdump-idle", 30*time.Second, "a node is dumping while its fence_kdump messages are at most this far apart")
	fs.DurationVar(&c.Engine.KdumpTimeout, "kdump-timeout", 10*time.Minute, "longest wait of power management for a kernel dump")
	fs.BoolVar(&c.Engine.Fence.Enabled, "auto-fence", defEng.Fence.Enabled, "fence not-ready nodes automatically (manual fencing is always available)")
	fs.DurationVar(&c.Engine.Fence.Timeout, "fence-timeout", defEng.Fence.Timeout, "how long a released node must be not ready before it is fenced")
	fs.Float64Var(&c.Engine.Fence.MaxUnresponsivePercent, "max-unresponsive-percent", defEng.Fence.MaxUnresponsivePercent, "no automatic fencing while more than this % of the cluster or zone is not ready (0: no limit)")
	fs.IntVar(&c.Engine.Fence.Budget, "fence-budget", defEng.Fence.Budget, "automatic fences per zone per --fence-budget-window (0: no budget)")
	fs.DurationVar(&c.Engine.Fence.BudgetWindow, "fence-budget-window", defEng.Fence.BudgetWindow, "window of --fence-budget")
	fs.DurationVar(&c.Engine.Fence.Settle, "fence-guard-settle", defEng.Fence.Settle, "how long the storm guard must let a released node's fence pass, without a break, before it is requested")
	fs.BoolVar(&c.Engine.Fence.AllowControlPlane, "fence-control-plane", false, "fence nodes matching --control-plane-selector automatically (never the last ready one)")
	fs.StringVar(&c.ControlPlaneSelector, "control-plane-selector", DefaultControlPlaneSelector, "label selector of control-plane nodes (Kubernetes mode)")
	fs.Func("kubelet-down-policy", `what a silent kubelet means while the node's agent reports (Kubernetes mode): "wait" (never fence; default) or "fence"`, func(v string) error {
		p, err := nodes.ParseKubeletDownPolicy(v)
		c.Engine.KubeletDownPolicy = p
		return err
	})
	fs.DurationVar(&c.ReleaseHealthyDelay, "release-healthy-delay", DefaultReleaseHealthyDelay, "how long a fenced node must be back and Ready before its out-of-service taint is removed (Kubernetes mode)")
	fs.DurationVar(&c.ElectionTTL, "election-ttl", 5*time.Second, "leader lease TTL (whole seconds)")
	fs.DurationVar(&c.FenceOpTimeout, "fence-op-timeout", 30*time.Second, "deadline of one driver call including read-back")
	fs.DurationVar(&c.DeviceCheckInterval, "device-check-interval", 5*time.Minute, "how often the leader checks every fence device with the driver's Monitor (0: never)")
	def := fencing.DefaultPolicy()
	fs.IntVar(&c.Fencing.Retries, "fence-retries", def.Retries, "retries of a failed fence record before it is escalated")
	fs.DurationVar(&c.Fencing.Backoff, "fence-retry-backoff", def.Backoff, "delay before the first retry; doubles each retry")
	fs.DurationVar(&c.Fencing.IsolationWait, "isolation-wait", def.IsolationWait, "after isolation, how long the node may recover before power management")
	fs.IntVar(&c.Fencing.Polls, "power-management-polls", def.Polls, "readiness polls after a power cycle before the record is an error")
	fs.DurationVar(&c.Fencing.PollInterval, "power-management-poll-interval", def.PollInterval, "interval of those polls")
	fs.DurationVar(&c.AgentHeartbeatInterval, "agent-heartbeat-interval", time.Second, "heartbeat interval sent to agents")
	fs.DurationVar(&c.AgentSampleInterval, "agent-sample-interval", time.Second, "sample interval sent to agents")
	c.DriverTLS.RegisterFlags(fs, "driver-", "fence-driver connections")
	fs.BoolVar(&c.EtcdUnsafeNoFsync, "etcd-unsafe-no-fsync", false, "embedded etcd without fsync (tests and demos only)")
	fs.IntVar(&c.GCPercent, "gc-percent", DefaultGCPercent, "garbage-collection target (GOGC; the GOGC variable wins), 50..1000; the soft memory limit is 90% of the container's")
}

// Defaults of Config fields.
const (
	DefaultGCPercent = 200
	// DefaultControlPlaneSelector selects the nodes kubeadm and most installers label control plane.
	DefaultControlPlaneSelector = "node-role.kubernetes.io/control-plane"
	// DefaultReleaseHealthyDelay is ReleaseHealthyDelay's default (medik8s NHC's healthyDelay is
	// of the same order).
	DefaultReleaseHealthyDelay = time.Minute
)

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	c.Server.SetDefaults()
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.EtcdPrefix == "" {
		c.EtcdPrefix = "/nodefence"
	}
	if c.Retention == (store.Retention{}) {
		c.Retention = store.DefaultRetention()
	}
	if c.Engine == (engine.Config{}) {
		c.Engine = engine.DefaultConfig()
	}
	c.Engine.SetDefaults()
	if c.FenceNamespace == "" {
		c.FenceNamespace = "nodefence"
	}
	if c.FencePolicy == "" {
		c.FencePolicy = "stateful"
	}
	if c.ElectionTTL == 0 {
		c.ElectionTTL = 5 * time.Second
	}
	if c.FenceOpTimeout == 0 {
		c.FenceOpTimeout = 30 * time.Second
	}
	if c.Fencing == (fencing.Policy{}) {
		c.Fencing = fencing.DefaultPolicy()
	}
	if c.AgentHeartbeatInterval == 0 {
		c.AgentHeartbeatInterval = time.Second
	}
	if c.GCPercent == 0 {
		c.GCPercent = DefaultGCPercent
	}
	if c.ControlPlaneSelector == "" {
		c.ControlPlaneSelector = DefaultControlPlaneSelector
	}
	if c.ReleaseHealthyDelay == 0 {
		c.ReleaseHealthyDelay = DefaultReleaseHealthyDelay
	}
	c.Engine.KubeletWitness = c.kubeMode()
	if c.AgentSampleInterval == 0 {
		c.AgentSampleInterval = time.Second
	}
}

// Validate returns every problem with the configuration.
func (c *Config) Validate() []error {
	errs := c.Server.Validate()
	if !c.kubeMode() && c.FenceConfig == "" {
		errs = append(errs, errors.New("--config: a fence configuration file is required in standalone mode (or --kubeconfig)"))
	}
	if c.FencePolicy != "" && c.FencePolicy != "stateful" && c.FencePolicy != "all" {
		errs = append(errs, fmt.Errorf("--fence-policy: %q is not stateful or all", c.FencePolicy))
	}
	for name, addr := range c.DriverEndpoints {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("--driver-endpoint %s: %q is not host:port", name, addr))
		}
	}
	errs = append(errs, c.EtcdAccess.Validate(len(c.EtcdEndpoints) > 0)...)
	errs = append(errs, c.validateRetention()...)
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir: required for the embedded etcd"))
	}
	if c.GCPercent < 50 || c.GCPercent > 1000 {
		errs = append(errs, fmt.Errorf("--gc-percent: %d is not in 50..1000", c.GCPercent))
	}
	if !strings.HasPrefix(c.EtcdPrefix, "/") || strings.HasSuffix(c.EtcdPrefix, "/") {
		errs = append(errs, fmt.Errorf("--etcd-prefix: %q must start and not end with /", c.EtcdPrefix))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"node-monitor-grace-period", c.Engine.NodeMonitorGracePeriod},
		{"node-startup-grace-period", c.Engine.NodeStartupGracePeriod},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("--%s: must be positive", d.flag))
		}
	}
	if _, err := labels.Parse(c.ControlPlaneSelector); err != nil {
		errs = append(errs, fmt.Errorf("--control-plane-selector: %w", err))
	}
	if c.ReleaseHealthyDelay < 0 {
		errs = append(errs, errors.New("--release-healthy-delay: must not be negative"))
	}
	if c.Engine.Fence.Settle < 0 {
		errs = append(errs, errors.New("--fence-guard-settle: must not be negative"))
	}
	if c.Engine.UnhealthyZoneThreshold <= 0 || c.Engine.UnhealthyZoneThreshold > 1 {
		errs = append(errs, fmt.Errorf("--unhealthy-zone-threshold: %v is not in (0, 1]", c.Engine.UnhealthyZoneThreshold))
	}
	if c.Engine.PodEviction.Rate < 0 || c.Engine.PodEviction.Burst < 1 || c.Engine.PodEviction.MaxInFlight < 1 || c.Engine.PodEviction.GrantTTL <= 0 {
		errs = append(errs, errors.New("--pod-eviction-rate: must not be negative; --pod-eviction-burst, --pod-eviction-max-in-flight, --pod-eviction-grant-ttl: must be positive"))
	}
	if c.Engine.NodeEvictionRate < 0 || c.Engine.SecondaryNodeEvictionRate < 0 {
		errs = append(errs, errors.New("--node-eviction-rate, --secondary-node-eviction-rate: must not be negative"))
	}
	if c.Engine.Fence.Timeout < 0 || c.Engine.Fence.BudgetWindow <= 0 || c.Engine.Fence.Budget < 0 {
		errs = append(errs, errors.New("--fence-timeout, --fence-budget: must not be negative; --fence-budget-window: must be positive"))
	}
	if c.Engine.Fence.MaxUnresponsivePercent < 0 || c.Engine.Fence.MaxUnresponsivePercent > 100 {
		errs = append(errs, fmt.Errorf("--max-unresponsive-percent: %v is not in 0..100", c.Engine.Fence.MaxUnresponsivePercent))
	}
	if c.Engine.LargeClusterSizeThreshold < 0 {
		errs = append(errs, errors.New("--large-cluster-size-threshold: must not be negative"))
	}
	if c.ElectionTTL < time.Second || c.ElectionTTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--election-ttl: %s must be a whole number of seconds, at least 1s", c.ElectionTTL))
	}
	if c.DeviceCheckInterval < 0 {
		errs = append(errs, errors.New("--device-check-interval: must not be negative"))
	}
	if c.FenceOpTimeout <= 0 {
		errs = append(errs, errors.New("--fence-op-timeout: must be positive"))
	}
	if c.Fencing.Retries < 0 || c.Fencing.Retries > 100 {
		errs = append(errs, fmt.Errorf("--fence-retries: %d is not in 0..100", c.Fencing.Retries))
	}
	if c.Fencing.Backoff <= 0 || c.Fencing.IsolationWait < 0 || c.Fencing.PollInterval <= 0 || c.Fencing.Polls < 0 {
		errs = append(errs, errors.New("--fence-retry-backoff, --power-management-poll-interval: must be positive; --isolation-wait, --power-management-polls: must not be negative"))
	}
	if c.AgentHeartbeatInterval <= 0 || c.AgentSampleInterval <= 0 {
		errs = append(errs, errors.New("--agent-heartbeat-interval, --agent-sample-interval: must be positive"))
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			errs = append(errs, fmt.Errorf("--advertise: %q is not host:port", c.Advertise))
		}
	}
	return append(errs, c.DriverTLS.Validate("driver-", false)...)
}

func (c *Config) kubeMode() bool { return c.Kubeconfig != "" || c.KubeREST != nil }

func (c *Config) driverMap() map[string]fenceconfig.Driver {
	m := map[string]fenceconfig.Driver{}
	for name, addr := range c.DriverEndpoints {
		m[name] = fenceconfig.Driver{Endpoint: addr}
	}
	return m
}

// App is a running coordinator replica.
type App struct {
	cfg     Config
	log     *slog.Logger
	fenceCf atomic.Pointer[fenceconfig.Config]
	etcd    *etcdembed.Etcd
	cli     *clientv3.Client
	store   *store.Store
	srv     *server.Server
	drivers *fencing.Drivers
	elector *leader.Elector
	// follower names a verified leader to clients of a replica that does not lead.
	follower  *leader.Follower
	advertise string

	metrics   *loop.Metrics
	kdump     *kdump.Listener
	kube      *kubeMode
	proof     *proof
	mu        sync.Mutex
	leading   *api.Leading
	fenceMx   *fenceMetrics
	devices   *deviceChecks
	closeOnce sync.Once
}

// New validates cfg, loads the fence configuration, starts etcd if embedded, and binds the server.
// Run starts serving.
func New(cfg Config, log *slog.Logger) (*App, error) {
	cfg.SetDefaults()
	errs := cfg.Validate()
	var fences *fenceconfig.Config
	if cfg.FenceConfig != "" {
		var err error
		if fences, err = fenceconfig.Load(cfg.FenceConfig); err != nil {
			var inv fault.Invalid
			if errors.As(err, &inv) {
				for _, fe := range inv {
					errs = append(errs, fmt.Errorf("--config %s: %s", cfg.FenceConfig, fe.Error()))
				}
			} else {
				errs = append(errs, fmt.Errorf("--config: %w", err))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.PodEvictionTimeout != 0 {
		log.Warn("--pod-eviction-timeout is deprecated and has no effect: Kubernetes removed it in 1.27; taint-based eviction (tolerationSeconds) decides when pods leave a not-ready node")
	}
	a := &App{cfg: cfg, log: log, drivers: fencing.NewDrivers(cfg.DriverTLS)}
	a.fenceCf.Store(fences)
	if cfg.kubeMode() {
		rc, err := kubeRESTConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		if a.kube, err = newKubeMode(a, rc); err != nil {
			return nil, err
		}
		if fences == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			c, err := a.kube.loadConfig(ctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("fence ConfigMaps in namespace %s: %w", cfg.FenceNamespace, err)
			}
			a.fenceCf.Store(c)
		}
	}
	endpoints, access := cfg.EtcdEndpoints, cfg.EtcdAccess
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("--data-dir: %w", err)
		}
		e, err := etcdembed.Start(etcdembed.Config{
			Name: "nodefence", DataDir: filepath.Join(cfg.DataDir, "etcd"),
			ClientListen: cfg.EtcdClientListen, PeerListen: cfg.EtcdPeerListen, UnsafeNoFsync: cfg.EtcdUnsafeNoFsync, Log: log,
			SecretsDir: filepath.Join(cfg.DataDir, "etcd-secrets"), Prefix: cfg.EtcdPrefix,
		})
		if err != nil {
			return nil, err
		}
		a.etcd = e
		endpoints, access = []string{e.Endpoint}, embeddedAccess(e.Client)
		log.Info("embedded etcd ready", "endpoint", e.Endpoint, "dir", cfg.DataDir, "secrets", filepath.Dir(e.Client.CAFile))
	}
	cc, err := access.clientConfig(endpoints, log)
	if err != nil {
		a.closeEtcd()
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		a.closeEtcd()
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	a.cli = cli
	a.store = store.New(cli, cfg.EtcdPrefix)
	a.store.Log = log
	// Agent streams carry every heartbeat and sample: observed per call, not per message.
	cfg.Server.BusyStreams = append(cfg.Server.BusyStreams, agentv1.AgentService_Connect_FullMethodName)
	srv, err := server.New(cfg.Server, log)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.srv = srv
	advertise := cfg.Advertise
	if advertise == "" {
		advertise = srv.Addr()
	}
	a.elector = leader.NewElector(cli, a.store.LeaderPrefix(), leader.Info{ID: cfg.ID, Address: advertise}, int(cfg.ElectionTTL/time.Second), log)
	a.follower, a.advertise = leader.NewFollower(cli, a.store.LeaderPrefix(), cfg.ID, log), advertise
	a.metrics = loop.NewMetrics(srv.Registry)
	a.proof = newProof(a, srv.Registry)
	srv.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodefence_store_corrupt_records_total",
		Help: "Stored fence record versions that could not be decoded and were skipped (each is logged once)."},
		func() float64 { return float64(a.store.CorruptRecords()) }))
	a.fenceMx = newFenceMetrics(srv.Registry, a.Term)
	a.devices = newDeviceChecks(srv.Registry)
	deps := &api.Deps{
		Leadership: a, Store: a.store, Etcd: cli, Config: a.fences,
		HeartbeatInterval: cfg.AgentHeartbeatInterval, SampleInterval: cfg.AgentSampleInterval,
		KnownNode: a.knownNode,
	}
	if a.kube != nil {
		deps.KubeletReporting = a.kubeletReporting
	}
	if cfg.KdumpListen != "" {
		if a.kdump, err = kdump.Listen(cfg.KdumpListen); err != nil {
			a.Close()
			return nil, err
		}
		a.kdump.Log, a.kdump.Resolve, a.kdump.Seen, a.kdump.Live = log, a.nodeByAddress, a.kdumpSeen, a.agentLive
		a.kdump.Messages = kdump.NewMessageCounter(srv.Registry)
	}
	coordv1.RegisterFenceServiceServer(srv.GRPC, &api.FenceServer{Deps: deps})
	coordv1.RegisterClusterServiceServer(srv.GRPC, &api.ClusterServer{Deps: deps})
	agentv1.RegisterAgentServiceServer(srv.GRPC, &api.AgentServer{Deps: deps})
	return a, nil
}

// fences is the current fence configuration.
func (a *App) fences() *fenceconfig.Config { return a.fenceCf.Load() }

// nodeByAddress names the configured node with the address.
func (a *App) nodeByAddress(ip netip.Addr) (string, bool) {
	for _, name := range a.fences().NodeNames() {
		for _, s := range a.fences().Nodes[name].Addresses {
			if addr, err := netip.ParseAddr(s); err == nil && addr.Unmap() == ip {
				return name, true
			}
		}
	}
	return "", false
}

// kdumpSeen hands a fence_kdump message to the leader's engine (followers ignore it).
func (a *App) kdumpSeen(node string, from netip.Addr, at time.Time) {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(l.Term.Context(), time.Second)
	defer cancel()
	if err := l.Loop.Step(ctx, engine.Kdump{Node: node, At: at}); err != nil {
		a.log.Warn("kdump message not applied", "node", node, "from", from, "err", err)
	}
}

// agentLive reports whether a witness of the node is alive: its agent streaming to this leader
// (connected and heard within five heartbeat intervals, at least 5 s) or, in Kubernetes mode, its
// kubelet's Lease renewed within the monitor grace period. A fence_kdump message never overrides
// such a witness. Followers answer false; they drop kdump messages anyway.
func (a *App) agentLive(node string) bool {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l == nil {
		return false
	}
	window := max(5*a.cfg.AgentHeartbeatInterval, 5*time.Second)
	ctx, cancel := context.WithTimeout(l.Term.Context(), time.Second)
	defer cancel()
	live := true // when the engine cannot answer, assume the witness is alive: kdump is only evidence
	_ = l.Loop.Query(ctx, func(e *engine.Engine) {
		n := e.Node(node)
		agent := n != nil && n.Connected && n.LastSeen != nil && time.Since(n.LastSeen.AsTime()) < window
		// Kubernetes mode: a kubelet whose Lease was renewed within the monitor grace period is a
		// live witness too.
		kubelet := n != nil && n.KubeletLastSeen != nil && time.Since(n.KubeletLastSeen.AsTime()) < a.cfg.Engine.NodeMonitorGracePeriod
		live = agent || kubelet
	})
	return live
}

// KdumpAddr is the kdump listener's address ("" when off).
func (a *App) KdumpAddr() string {
	if a.kdump == nil {
		return ""
	}
	return a.kdump.Addr()
}

// Addr is the gRPC address.
func (a *App) Addr() string { return a.srv.Addr() }

// EtcdEndpoint is the embedded etcd's client URL ("" with external etcd).
func (a *App) EtcdEndpoint() string {
	if a.etcd == nil {
		return ""
	}
	return a.etcd.Endpoint
}

// EtcdAccess is what another process needs to use the embedded etcd (zero with external etcd).
func (a *App) EtcdAccess() EtcdAccess {
	if a.etcd == nil {
		return EtcdAccess{}
	}
	return embeddedAccess(a.etcd.Client)
}

// Etcd is the app's etcd client.
func (a *App) Etcd() *clientv3.Client { return a.cli }

// Store is the app's record store.
func (a *App) Store() *store.Store { return a.store }

// Leading implements api.Leadership.
func (a *App) Leading(ctx context.Context) (*api.Leading, error) {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l != nil && l.Term.Context().Err() == nil {
		return l, nil
	}
	v := a.follower.View(ctx)
	switch {
	case v.Err != nil:
		return nil, fmt.Errorf("not the leader, and this coordinator cannot reach etcd to name one; try another: %w", fault.ErrUnreachable)
	case !v.Found || v.Leader.ID == a.cfg.ID:
		return nil, &fault.NotLeaderError{}
	case !v.Answers:
		return nil, fmt.Errorf("not the leader; the leader %s at %s does not answer, an election is under way; retry shortly: %w",
			v.Leader.ID, v.Leader.Address, fault.ErrUnreachable)
	}
	return nil, &fault.NotLeaderError{LeaderID: v.Leader.ID, LeaderAddress: v.Leader.Address}
}

// etcdClientConfig is the etcd client's configuration: keepalive pings find a connection that a
// partition left dead (etcd refuses pings more often than every 5 s), and every unary call without
// a deadline of its own gets one, so no etcd read or write can block a coordinator for ever.
func etcdClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 6 * time.Second, DialKeepAliveTimeout: 3 * time.Second, PermitWithoutStream: true,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if _, ok := ctx.Deadline(); !ok {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, etcdCallTimeout)
					defer cancel()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	}
}

// etcdCallTimeout is the deadline of an etcd call made without one (listing many records is the
// slowest; the election's own calls have leader.CallTimeout).
const etcdCallTimeout = 10 * time.Second

// Term returns the current leadership term, or nil when not leading.
func (a *App) Term() *leader.Term {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.leading == nil || a.leading.Term.Context().Err() != nil {
		return nil
	}
	return a.leading.Term
}

// Run serves and campaigns until ctx ends, then stops everything it started.
func (a *App) Run(ctx context.Context) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.srv.Serve() }()
	a.srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if a.kube != nil {
		go a.kube.run(ctx)
	}
	if a.kdump != nil {
		go func() {
			if err := a.kdump.Run(ctx); err != nil {
				a.log.Error("kdump listener stopped", "err", err)
			}
		}()
	}
	defer a.Close()
	go a.follower.Run(ctx, 100*time.Millisecond)
	for ctx.Err() == nil {
		select {
		case err := <-serveErr:
			return fmt.Errorf("grpc server: %w", err)
		default:
		}
		var term *leader.Term
		err := a.reachable(ctx)
		if err == nil {
			term, err = a.elector.Campaign(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			a.log.Warn("campaign failed, retrying", "err", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
			continue
		}
		a.lead(term)
		select {
		case <-term.Context().Done():
			a.log.Warn("leadership term ended", "epoch", term.Epoch)
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = term.Resign(rctx)
			cancel()
		}
		a.mu.Lock()
		a.leading = nil
		a.mu.Unlock()
		a.fenceMx.reset()
	}
	return nil
}

// reachable checks that this replica's advertised address accepts connections before it campaigns:
// other replicas remove the election key of a leader whose address refuses them.
func (a *App) reachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", a.advertise)
	if err != nil {
		return fmt.Errorf("--advertise %s does not accept connections, not campaigning: %w", a.advertise, err)
	}
	return c.Close()
}

// lead sets up one term: an engine loop (every node gets a fresh grace period; persisted state is
// restored), a runner that resumes every active fence record, the device checks, the history's
// index and pruning, and in Kubernetes mode the mirror's term.
func (a *App) lead(term *leader.Term) {
	var initial []engine.Input
	now := time.Now()
	for _, n := range a.fences().NodeNames() {
		nc := a.fences().Nodes[n]
		initial = append(initial, engine.Configured{Node: n, Region: nc.Region, Zone: nc.Zone, Fenceable: true, At: now})
	}
	var runner *fencing.Runner
	lp := loop.New(loop.Config{
		Engine: a.cfg.Engine, Term: term, Etcd: a.cli, Prefix: a.cfg.EtcdPrefix,
		Initial: initial, Metrics: a.metrics, Log: a.log,
		Audit: func(ev engine.Event) clientv3.Op {
			return a.store.AuditOp(ev.At, term.Epoch, ev.Node, ev.Kind, ev.Text)
		},
		OnReady: func(rd engine.Ready) {
			for _, f := range rd.Fences {
				go a.autoFence(term, runner, f)
			}
			if a.kube != nil {
				a.kube.onReady(rd)
			}
		},
	})
	go func() {
		if err := lp.Run(term.Context()); err != nil {
			a.log.Error("engine loop stopped; resigning", "err", err)
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = term.Resign(rctx)
			cancel()
		}
	}()
	var secrets fenceconfig.SecretReader
	if a.kube != nil {
		secrets = a.kube.secret
	}
	runner = &fencing.Runner{Store: a.store, Secrets: secrets, Term: term, Config: a.fences, Drivers: a.drivers, OpTimeout: a.cfg.FenceOpTimeout,
		Policy: a.cfg.Fencing, Log: a.log, OnChange: func(f *coordv1.NodeFence) { a.fenceChanged(term, f) },
		Facts: func(ctx context.Context, node string) (bool, time.Time) {
			var ready bool
			var kdumpUntil time.Time
			_ = lp.Query(ctx, func(e *engine.Engine) {
				n := e.Node(node)
				ready = n != nil && n.Readiness == coordv1.Readiness_READINESS_READY
				kdumpUntil = e.KdumpUntil(node)
			})
			return ready, kdumpUntil
		}}
	a.mu.Lock()
	a.leading = &api.Leading{Term: term, Runner: runner, Loop: lp}
	a.mu.Unlock()
	go a.devices.run(term.Context(), a, secrets, a.cfg.DeviceCheckInterval)
	if n, err := a.store.IndexHistory(term.Context(), term); err != nil {
		a.log.Error("cannot index the fence history; older records are missing from listings until the next term", "err", err)
	} else if n > 0 {
		a.log.Info("indexed the fence history by time", "records", n)
	}
	go a.pruneHistory(term)
	if a.kube != nil {
		a.kube.startTerm(term, lp)
	}
	active, err := a.store.ActiveFences(term.Context())
	if err != nil {
		a.log.Error("cannot list records to resume; they resume at the next term", "err", err)
		return
	}
	for _, f := range active {
		a.log.Info("resuming fence record", "fence", f.Id, "node", f.Node, "status", f.Status.String())
		runner.Start(f.Id)
	}
}

// fenceChanged audits a fence record's new version and observes its stage durations.
func (a *App) fenceChanged(term *leader.Term, f *coordv1.NodeFence) {
	text := fmt.Sprintf("fence %s (%s, attempt %d): %s %s", f.Id, cli.EnumWord(f.Action.String()), f.Retries+1,
		cli.EnumWord(f.Step.String()), cli.EnumWord(f.Status.String()))
	if n := len(f.Operations); n > 0 {
		op := f.Operations[n-1]
		text += fmt.Sprintf("; %s %s via %s: %s", op.Method, op.Action, op.Driver, cli.EnumWord(op.Result.String()))
		if op.Error != "" {
			text += " (" + op.Error + ")"
		}
	}
	if f.FinishedAt != nil {
		text += "; finished"
		if f.Error != "" {
			text += ": " + f.Error
		}
	}
	a.audit(term, f.Node, "fence", text)
	a.metrics.ObserveFence(f)
	a.proof.observe(term, f)
	a.fenceMx.observe(f)
	if a.kube != nil {
		a.kube.onFence(f)
	}
}

// audit appends one entry to the audit trail under the term's epoch.
func (a *App) audit(term *leader.Term, node, kind, text string) {
	ctx, cancel := context.WithTimeout(term.Context(), 5*time.Second)
	defer cancel()
	if _, err := term.Txn(ctx, nil, a.store.AuditOp(time.Now(), term.Epoch, node, kind, text)); err != nil {
		a.log.Warn("audit entry not written", "node", node, "kind", kind, "err", err)
	}
}

// autoFence starts the engine's automatic fence request: a record with the engine's evidence and
// the node's configured delay. It runs on a goroutine of its own, started from the loop's OnReady
// after the request was persisted.
func (a *App) autoFence(term *leader.Term, runner *fencing.Runner, req engine.FenceRequest) {
	if a.kube != nil {
		ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
		ok, why := a.kube.needsFencing(ctx, req.Node)
		cancel()
		if !ok {
			a.audit(term, req.Node, "fence-held-back", "automatic fencing not needed: "+why)
			return
		}
		if why != "" {
			req.Evidence = append(req.Evidence, why)
		}
	}
	now := time.Now()
	nc := a.fences().Nodes[req.Node]
	delay := nc.Delay.Duration
	if nc.RandomDelay.Duration > 0 {
		delay += time.Duration(rand.Int64N(int64(nc.RandomDelay.Duration)))
	}
	rec := fencing.NewRecord(api.NewID(req.Node, now), req.Node, coordv1.FenceAction_FENCE_ACTION_OFF,
		func(step string) ([]fenceconfig.Resolved, error) { return a.fences().Plan(req.Node, step) }, delay, now)
	rec.Reason, rec.RequestedBy, rec.Automatic, rec.Epoch = "node not ready past the fence timeout", "coordinator", true, term.Epoch
	rec.Evidence = append(req.Evidence, rec.Evidence...)
	if !req.KdumpSince.IsZero() {
		// Evidence only: an unauthenticated datagram never confirms a power-off. The record is
		// confirmed by the driver's read-back after power management, which waits for the dump.
		rec.Evidence = append(rec.Evidence, "dumping its memory (fence_kdump, unauthenticated evidence); power management waits for the dump")
	}
	ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
	defer cancel()
	got, _, created, err := a.store.CreateFence(ctx, term, rec)
	if err != nil {
		a.log.Error("automatic fence not started", "node", req.Node, "err", err)
		return
	}
	if created {
		a.log.Warn("automatic fence started", "node", req.Node, "fence", got.Id, "evidence", strings.Join(rec.Evidence, "; "))
		if !req.LastContact.IsZero() {
			a.metrics.ObserveStage("detect", req.NotReadySince.Sub(req.LastContact))
		}
		a.metrics.ObserveStage("decide", req.At.Sub(req.NotReadySince))
	}
	runner.Start(got.Id)
}

// Close stops the server, the drivers' connections, the etcd client and the embedded etcd.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		if a.srv != nil {
			a.srv.Stop()
		}
		a.drivers.Close()
		if a.cli != nil {
			a.cli.Close()
		}
		a.closeEtcd()
	})
}

func (a *App) closeEtcd() {
	if a.etcd != nil {
		a.etcd.Close()
		a.etcd = nil
	}
}

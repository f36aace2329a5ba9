package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Defaults of Config.
const (
	DefaultNodes  = 3
	DefaultPrefix = "nf"
	// DefaultSubnet is the bridge's subnet: .1 is the apiserver, .2 the address reserved for
	// services on the host that the nodes reach (nodefence's coordinators), node i is .10+i.
	DefaultSubnet = "10.203.0.0/24"
	// DefaultPodNetwork holds one /24 per node: node i's pods are in 10.204.i.0/24.
	DefaultPodNetwork = "10.204.0.0/16"
	// DefaultServiceCIDR is the apiserver's service range; nothing routes it (no kube-proxy).
	DefaultServiceCIDR = "10.205.0.0/24"
	// MaxNodes bounds Config.Nodes.
	MaxNodes = 9
	// MinPodsMemory bounds Config.PodsMemory from below (a node's pause containers and the
	// tests' pods must fit).
	MinPodsMemory = 128 << 20
)

// Config describes a cluster. The zero value plus Dir is a valid configuration.
type Config struct {
	// Dir holds everything the cluster writes: certificates, configuration, data, logs, node
	// directories. Required; absolute.
	Dir string
	// Nodes is the number of nodes, node-1 .. node-N (default 3, at most MaxNodes).
	Nodes int
	// Prefix names what the cluster creates on the machine: the bridge <prefix>br0, namespaces
	// <prefix>-node-<i>, veths <prefix>v<i>, cgroup roots /<prefix>-node-<i> (default "nf").
	Prefix string
	// Zones are the topology.kubernetes.io/zone labels, given to the nodes round-robin (default
	// one zone, "zone-a"). Region is topology.kubernetes.io/region (default "region-1").
	Zones  []string
	Region string
	// NodeMonitorGracePeriod and NodeMonitorPeriod are kube-controller-manager's flags of the
	// same names (0: its defaults, 50s and 5s).
	NodeMonitorGracePeriod, NodeMonitorPeriod time.Duration
	// StartTimeout bounds Up (default 3 minutes).
	StartTimeout time.Duration
	// PodsMemory, when set, is each node's allocatable memory in bytes, enforced on its pods'
	// cgroup (kubelet's enforceNodeAllocatable: [pods], with systemReserved memory = the machine's
	// MemTotal - PodsMemory): the nodes' pods then share a memory limit of their own, and
	// allocatableMemory.available measures pressure per node, whatever the machine's free memory.
	// 0: nothing enforced (the nodes' pods share the machine's memory).
	PodsMemory int64
}

// SetDefaults fills the zero fields.
func (c *Config) SetDefaults() {
	if c.Nodes == 0 {
		c.Nodes = DefaultNodes
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if len(c.Zones) == 0 {
		c.Zones = []string{"zone-a"}
	}
	if c.Region == "" {
		c.Region = "region-1"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 3 * time.Minute
	}
}

// Validate returns every problem of the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Dir == "" || !strings.HasPrefix(c.Dir, "/") {
		errs = append(errs, fmt.Errorf("cluster config: Dir: must be an absolute path, got %q", c.Dir))
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		errs = append(errs, fmt.Errorf("cluster config: Nodes: must be 1 to %d, got %d", MaxNodes, c.Nodes))
	}
	if len(c.Prefix) < 1 || len(c.Prefix) > 4 || strings.Trim(c.Prefix, "abcdefghijklmnopqrstuvwxyz") != "" {
		errs = append(errs, fmt.Errorf("cluster config: Prefix: must be 1 to 4 lowercase letters, got %q", c.Prefix))
	}
	for i, z := range c.Zones {
		if z == "" {
			errs = append(errs, fmt.Errorf("cluster config: Zones[%d]: empty", i))
		}
	}
	if c.PodsMemory != 0 && c.PodsMemory < MinPodsMemory {
		errs = append(errs, fmt.Errorf("cluster config: PodsMemory: at least %d bytes, got %d", MinPodsMemory, c.PodsMemory))
	}
	if c.NodeMonitorGracePeriod < 0 || c.NodeMonitorPeriod < 0 || c.StartTimeout < 0 {
		errs = append(errs, errors.New("cluster config: NodeMonitorGracePeriod, NodeMonitorPeriod, StartTimeout: must not be negative"))
	}
	return errors.Join(errs...)
}

// layout is where things are on the machine, derived from a valid Config.
type layout struct {
	Bridge      string
	Subnet      netip.Prefix
	APIServerIP netip.Addr // on the bridge
	ServiceIP   netip.Addr // a second bridge address for host services the nodes call
	ServiceCIDR string
	KubeService netip.Addr // first address of ServiceCIDR: the apiserver's in-cluster IP
}

func newLayout(c Config) layout {
	subnet := netip.MustParsePrefix(DefaultSubnet)
	base := subnet.Addr().As4()
	return layout{
		Bridge:      c.Prefix + "br0",
		Subnet:      subnet,
		APIServerIP: netip.AddrFrom4([4]byte{base[0], base[1], base[2], 1}),
		ServiceIP:   netip.AddrFrom4([4]byte{base[0], base[1], base[2], 2}),
		ServiceCIDR: DefaultServiceCIDR,
		KubeService: netip.MustParseAddr("10.205.0.1"),
	}
}

// nodeAddrs returns node i's (1-based) address on the bridge and its pod CIDR.
func nodeAddrs(l layout, i int) (netip.Addr, netip.Prefix) {
	b := l.Subnet.Addr().As4()
	pods := netip.MustParsePrefix(DefaultPodNetwork).Addr().As4()
	return netip.AddrFrom4([4]byte{b[0], b[1], b[2], byte(10 + i)}),
		netip.PrefixFrom(netip.AddrFrom4([4]byte{pods[0], pods[1], byte(i), 0}), 24)
}

// containerdConfig renders node n's containerd configuration: everything under its directory,
// CRI with the facts this machine needs (no CAP_SYS_RESOURCE: restrict_oom_score_adj; no
// AppArmor; cgroupfs), CNI from the Debian plugins with n's own configuration directory.
func containerdConfig(n *Node) string {
	d := n.Dir
	return fmt.Sprintf(`version = 2
root = "%[1]s/containerd/root"
state = "%[1]s/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "%[1]s/containerd.sock"
[ttrpc]
  address = "%[1]s/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[2]q
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  stream_server_address = %[3]q
  stream_server_port = "0"
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "%[1]s/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "%[1]s/containerd/runc"
`, d, PauseImage, n.IP.String())
}

// cniConfig renders node n's CNI network: a bridge in the node's namespace with host-local
// addresses from its pod CIDR (state under its directory), and loopback.
func cniConfig(n *Node) string {
	return fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "nodefence-%[1]s", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "%[2]s/ipam", "ranges": [[{"subnet": %[3]q}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
`, n.Name, n.Dir, n.PodCIDR.String())
}

// kubeletConfig renders node n's KubeletConfiguration: cgroup v1 with cgroupfs under n's own
// cgroup root, its own containerd, pod logs and addresses; no DNS, no image GC, no eviction (the
// nodes share one machine's resources), no graceful shutdown. With reserved > 0 the pods' cgroup
// is limited to the node's allocatable memory: MemTotal - reserved.
func kubeletConfig(n *Node, caFile string, reserved int64) string {
	enforce := "enforceNodeAllocatable: []\n"
	if reserved > 0 {
		enforce = fmt.Sprintf("enforceNodeAllocatable: [pods]\nsystemReserved: {memory: \"%d\"}\n", reserved)
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://%[2]s/containerd.sock
address: %[3]s
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
podLogsDir: %[2]s/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]q}
authorization: {mode: Webhook}
clusterDNS: []
clusterDomain: cluster.local
podCIDR: %[5]s
resolvConf: ""
registerNode: true
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 1m
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
shutdownGracePeriod: 0s
`, n.CgroupRoot, n.Dir, n.IP.String(), caFile, n.PodCIDR.String()) + enforce
}

// Package cluster runs a real multi-node Kubernetes on one machine for nodefence's end-to-end
// tests, `make cluster` and `make bench-recovery`: etcd, kube-apiserver, kube-controller-manager
// (node lifecycle controller on) and kube-scheduler on the host, and N nodes, each in its own
// network namespace with its own containerd, runc state, CNI bridge, cgroup root and kubelet. The
// Kubernetes binaries are v1.36.3 built from Go modules (testbed/kube/kubetest); containerd, runc
// and the CNI plugins are Debian's. Images are made locally (a pause compiled with gcc, a busybox
// image) and imported into each node: there is no registry.
//
// Each node has an ipmi_sim BMC (testbed/ipmisim) that really powers it: chassis power off
// SIGKILLs every process of the node (its network namespace and its cgroup tree, pods included)
// before the BMC reads off; power on boots it again (containerd, kubelet and the node's
// Services), and the node rejoins. A node may have a watchdog device (Node.StartWatchdog) that,
// armed and unfed, resets the node the same way: power off, then on.
//
// Only the bridge's subnet (DefaultSubnet), the pod network and 127.0.0.1 are ever addressed.
// Up takes a machine-wide lock per Prefix; Down leaves nothing running or mounted and restores
// the sysctls kubelet rewrites.
package cluster

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/procs"
)

// Binaries inside kubetest.AssetsDir.
const (
	kubeletBin   = kubetest.KubeletBinary
	apiBin       = kubetest.APIServerBinary
	kcmBin       = kubetest.ControllerManagerBinary
	schedulerBin = kubetest.SchedulerBinary
	etcdBin      = kubetest.EtcdBinary
)

// BMCUser is the administrator of every node's BMC; the password is in <Dir>/bmc-password.
const BMCUser = "admin"

// Cluster is a running cluster.
type Cluster struct {
	Config Config
	Nodes  []*Node

	layout     layout
	log        *slog.Logger
	assets     string
	pki        *pki
	pauseTar   string
	busyboxTar string
	bmcPass    string
	// nodefenceCA signs the certificates of nodefence deployed on the cluster (authz.go).
	nodefenceCA     *certs.CA
	nodefenceCAFile string

	etcd, apiserver, kcm, scheduler *proc
	etcdURL                         string

	sysctls   map[string]string // the machine's values of kubeletSysctls
	lock      *os.File
	stopPower chan struct{}
	powerWG   sync.WaitGroup
	stopped   atomic.Bool
	downOnce  sync.Once
	downErr   error
}

// hostTools are the programs Up runs, with the Debian package of each.
var hostTools = [][2]string{
	{"containerd", "containerd"}, {"runc", "runc"}, {"ctr", "containerd"}, {"nsenter", "util-linux"},
	{"ip", "iproute2"}, {"gcc", "gcc"}, {"ipmi_sim", "openipmi"}, {"/usr/lib/cni/bridge", "containernetworking-plugins"},
	{"/usr/lib/cni/host-local", "containernetworking-plugins"}, {"/bin/busybox", "busybox-static"},
}

// Up starts a cluster as cfg describes and returns once every node is Ready and the default
// ServiceAccount exists. On failure it tears down what it started and returns the failing
// component's log tail. log receives progress (nil: discarded).
func Up(ctx context.Context, cfg Config, log *slog.Logger) (*Cluster, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	assets, err := kubetest.AssetsDir()
	if err != nil {
		return nil, err
	}
	if err := checkHost(assets); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(cfg.StartTimeout)
	lock, err := lockMachine(cfg.Prefix, time.Until(deadline))
	if err != nil {
		return nil, err
	}
	c := &Cluster{Config: cfg, layout: newLayout(cfg), log: log, assets: assets, lock: lock, stopPower: make(chan struct{})}
	for i := 1; i <= cfg.Nodes; i++ {
		n := &Node{Name: "node-" + strconv.Itoa(i), Netns: cfg.Prefix + "-node-" + strconv.Itoa(i),
			Veth: cfg.Prefix + "v" + strconv.Itoa(i), CgroupRoot: "/" + cfg.Prefix + "-node-" + strconv.Itoa(i),
			Dir: filepath.Join(cfg.Dir, "nodes", "node-"+strconv.Itoa(i)), Zone: cfg.Zones[(i-1)%len(cfg.Zones)], c: c}
		n.IP, n.PodCIDR = nodeAddrs(c.layout, i)
		c.Nodes = append(c.Nodes, n)
	}
	// What a cluster of this prefix left behind when its process died without Down.
	sweep(cfg.Prefix, MaxNodes, log)
	ok := false
	defer func() {
		if !ok {
			_ = c.Down()
		}
	}()
	if err := writeFileAtomic(statePath(cfg.Prefix), []byte(cfg.Dir+"\n")); err != nil {
		return nil, err
	}
	if c.sysctls, err = saveSysctls(cfg.Prefix); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.netUp(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(deadline); err != nil {
		return nil, err
	}
	log.Info("etcd ready", "after", time.Since(start).Round(time.Millisecond))
	// Containerd and the image import run while the apiserver starts.
	if err := c.startNodesAndAPIServer(deadline); err != nil {
		return nil, err
	}
	log.Info("apiserver and containerd ready", "after", time.Since(start).Round(time.Millisecond))
	if err := c.startControllers(); err != nil {
		return nil, err
	}
	if err := c.startKubelets(); err != nil {
		return nil, err
	}
	if err := c.WaitReady(ctx, time.Until(deadline)); err != nil {
		return nil, err
	}
	if err := c.waitDefaultServiceAccount(ctx, deadline); err != nil {
		return nil, err
	}
	log.Info("cluster ready", "nodes", len(c.Nodes), "after", time.Since(start).Round(time.Millisecond))
	ok = true
	return c, nil
}

// bin is the path of a Kubernetes binary.
func (c *Cluster) bin(name string) string { return filepath.Join(c.assets, name) }

// prepare writes the directories, images, certificates, kubeconfigs, node configurations and
// cgroup roots, and starts the BMCs.
func (c *Cluster) prepare() error {
	cfg := c.Config
	// A cluster starts fresh: no objects, node state or logs of an earlier one in the same Dir.
	for _, d := range []string{"etcd", "nodes", "apiserver-certs", "log", "shared"} {
		if err := os.RemoveAll(filepath.Join(cfg.Dir, d)); err != nil {
			return err
		}
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "log"), c.SharedDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var err error
	if c.pauseTar, c.busyboxTar, err = buildImages(filepath.Join(cfg.Dir, "images")); err != nil {
		return err
	}
	if c.pki, err = newPKI(filepath.Join(cfg.Dir, "pki")); err != nil {
		return err
	}
	if err := c.issueCerts(); err != nil {
		return err
	}
	pass := make([]byte, 8)
	if _, err := io.ReadFull(crand.Reader, pass); err != nil {
		return err
	}
	c.bmcPass = fmt.Sprintf("%x", pass)
	if err := os.WriteFile(c.BMCPasswordFile(), []byte(c.bmcPass), 0o600); err != nil {
		return err
	}
	var reserved int64
	if cfg.PodsMemory > 0 {
		total, err := memTotal()
		if err != nil {
			return err
		}
		if reserved = total - cfg.PodsMemory; reserved <= 0 {
			return fmt.Errorf("cluster config: PodsMemory: %d bytes is not below the machine's MemTotal %d", cfg.PodsMemory, total)
		}
	}
	for _, n := range c.Nodes {
		for _, d := range []string{"containerd", "cni", "ipam", "kubelet", "pod-logs", "log"} {
			if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
				return err
			}
		}
		files := map[string]string{
			"containerd.toml":           containerdConfig(n),
			"cni/10-nodefence.conflist": cniConfig(n),
			"kubelet.yaml":              kubeletConfig(n, c.pki.path("ca.crt"), reserved),
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(n.Dir, name), []byte(data), 0o644); err != nil {
				return err
			}
		}
		if err := makeCgroupRoot(n.CgroupRoot); err != nil {
			return err
		}
		if n.BMC, err = ipmisim.Start(filepath.Join(n.Dir, "bmc"), 0, BMCUser, c.bmcPass); err != nil {
			return err
		}
	}
	return nil
}

// memTotal is the machine's MemTotal in bytes, the memory capacity kubelet reports (cadvisor
// reads /proc/meminfo).
func memTotal() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo: no MemTotal in kB")
}

// IssueClient issues a client certificate for user cn in the groups orgs, signed by the
// cluster's CA, and writes a kubeconfig for it: <Dir>/<name>.kubeconfig, which it returns.
func (c *Cluster) IssueClient(name, cn string, orgs ...string) (string, error) {
	if err := c.pki.issue(name, cn, orgs, nil, nil); err != nil {
		return "", err
	}
	path := filepath.Join(c.Config.Dir, name+".kubeconfig")
	kc := kubeconfig(c.APIServerURL(), c.pki.path("ca.crt"), c.pki.path(name+".crt"), c.pki.path(name+".key"), cn)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// APIServerURL is https://<bridge address>:6443.
func (c *Cluster) APIServerURL() string {
	return "https://" + net.JoinHostPort(c.layout.APIServerIP.String(), "6443")
}

// AdminKubeconfig is the kubeconfig of a system:masters client (for kubectl and test setup).
func (c *Cluster) AdminKubeconfig() string { return filepath.Join(c.Config.Dir, "admin.kubeconfig") }

// RESTConfig loads a client configuration from a kubeconfig IssueClient wrote.
func RESTConfig(kubeconfigPath string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// Admin is an admin clientset.
func (c *Cluster) Admin() (*kubernetes.Clientset, error) {
	cfg, err := RESTConfig(c.AdminKubeconfig())
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// HostIP is the second bridge address: where host services the nodes call (coordinators)
// listen.
func (c *Cluster) HostIP() netip.Addr { return c.layout.ServiceIP }

// SharedDir is a directory every node sees (one machine, one filesystem): a hostPath
// PersistentVolume without node affinity here follows its pod to any node.
func (c *Cluster) SharedDir() string { return filepath.Join(c.Config.Dir, "shared") }

// BMCPasswordFile holds the password of every node's BMC user BMCUser.
func (c *Cluster) BMCPasswordFile() string { return filepath.Join(c.Config.Dir, "bmc-password") }

// BMCPassword is that password.
func (c *Cluster) BMCPassword() string { return c.bmcPass }

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (c *Cluster) startEtcd(deadline time.Time) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.etcd, err = spawn("etcd", filepath.Join(c.Config.Dir, "log", "etcd.log"), nil, nil, c.bin(etcdBin),
		"--name=nodefence-testbed", "--data-dir="+filepath.Join(c.Config.Dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=nodefence-testbed="+peer, "--initial-cluster-state=new",
		"--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=1073741824")
	if err != nil {
		return err
	}
	c.etcdURL = client
	return waitHTTP(c.etcd, http.DefaultClient, client+"/health", deadline)
}

func (c *Cluster) startAPIServer(deadline time.Time) error {
	p := c.pki.path
	authz, err := c.writeAuthorizationConfig()
	if err != nil {
		return err
	}
	c.apiserver, err = spawn("kube-apiserver", filepath.Join(c.Config.Dir, "log", "kube-apiserver.log"), nil, nil, c.bin(apiBin),
		"--etcd-servers="+c.etcdURL,
		"--bind-address="+c.layout.APIServerIP.String(), "--advertise-address="+c.layout.APIServerIP.String(), "--secure-port=6443",
		"--cert-dir="+filepath.Join(c.Config.Dir, "apiserver-certs"),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"), "--client-ca-file="+p("ca.crt"),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--authorization-config="+authz, "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
		// No kube-proxy: a webhook named by its Service (deploy/webhook-node-agent.yaml) is called
		// at a ready endpoint of the Service, not at its unrouted ClusterIP.
		"--enable-aggregator-routing=true",
		"--service-cluster-ip-range="+c.layout.ServiceCIDR, "--v=1")
	if err != nil {
		return err
	}
	hc, err := c.adminHTTP()
	if err != nil {
		return err
	}
	return waitHTTP(c.apiserver, hc, c.APIServerURL()+"/readyz", deadline)
}

// adminHTTP is an HTTP client with the admin certificate.
func (c *Cluster) adminHTTP() (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(c.pki.path("admin.crt"), c.pki.path("admin.key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}, nil
}

func (c *Cluster) startControllers() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	p := c.pki.path
	kc := func(n string) string { return filepath.Join(c.Config.Dir, n+".kubeconfig") }
	args := []string{"--kubeconfig=" + kc("kcm"), "--authentication-kubeconfig=" + kc("kcm"), "--authorization-kubeconfig=" + kc("kcm"),
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]), "--leader-elect=false",
		"--use-service-account-credentials=true", "--service-account-private-key-file=" + p("sa.key"), "--root-ca-file=" + p("ca.crt"),
		"--cluster-signing-cert-file=" + p("ca.crt"), "--cluster-signing-key-file=" + p("ca.key"), "--v=1"}
	if g := c.Config.NodeMonitorGracePeriod; g > 0 {
		args = append(args, "--node-monitor-grace-period="+g.String())
	}
	if g := c.Config.NodeMonitorPeriod; g > 0 {
		args = append(args, "--node-monitor-period="+g.String())
	}
	if c.kcm, err = spawn("kube-controller-manager", filepath.Join(c.Config.Dir, "log", "kube-controller-manager.log"), nil, nil, c.bin(kcmBin), args...); err != nil {
		return err
	}
	c.scheduler, err = spawn("kube-scheduler", filepath.Join(c.Config.Dir, "log", "kube-scheduler.log"), nil, nil, c.bin(schedulerBin),
		"--kubeconfig="+kc("scheduler"), "--authentication-kubeconfig="+kc("scheduler"), "--authorization-kubeconfig="+kc("scheduler"),
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[1]), "--leader-elect=false", "--v=1")
	return err
}

// WaitReady waits up to timeout until every running node is Ready (restarting a kubelet that
// exited), failing with the log tail of any control-plane process that died.
func (c *Cluster) WaitReady(ctx context.Context, timeout time.Duration) error {
	cs, err := c.Admin()
	if err != nil {
		return err
	}
	var notReady []string
	return poll(time.Now().Add(timeout), 250*time.Millisecond, func() (bool, error) {
		if err := c.checkControlPlane(); err != nil {
			return false, err
		}
		notReady = notReady[:0]
		for _, n := range c.Nodes {
			if err := n.watchKubelet(c.log); err != nil {
				return false, err
			}
			if !n.Running() {
				continue
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || !NodeReady(node) {
				notReady = append(notReady, n.Name)
			}
		}
		return len(notReady) == 0, ctx.Err()
	}, func() error {
		var tails []error
		for _, name := range notReady {
			n := c.Node(name)
			tails = append(tails, fmt.Errorf("%s not Ready; kubelet log tail:\n%s", name, procs.Tail(n.logPath("kubelet"), 15)))
		}
		return fmt.Errorf("nodes not Ready within %s: %w: %w", timeout, errTimeout, errors.Join(tails...))
	})
}

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkControlPlane fails with the log tail of the first control-plane process that exited.
func (c *Cluster) checkControlPlane() error {
	for _, p := range []*proc{c.etcd, c.apiserver, c.kcm, c.scheduler} {
		if p != nil && p.exited() {
			return p.failure("exited")
		}
	}
	return nil
}

func (c *Cluster) waitDefaultServiceAccount(ctx context.Context, deadline time.Time) error {
	cs, err := c.Admin()
	if err != nil {
		return err
	}
	return poll(deadline, 200*time.Millisecond, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, c.checkControlPlane()
	}, func() error { return c.kcm.failure("no default ServiceAccount: " + errTimeout.Error()) })
}

// waitHTTP polls url until it answers 200, p exits (an error with its log tail) or deadline.
func waitHTTP(p *proc, hc *http.Client, url string, deadline time.Time) error {
	var last string
	return poll(deadline, 100*time.Millisecond, func() (bool, error) {
		if p.exited() {
			return false, p.failure("exited at start")
		}
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	}, func() error { return p.failure(fmt.Sprintf("%s not ready (last: %s): %v", url, last, errTimeout)) })
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

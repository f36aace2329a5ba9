// Package nfcluster runs nodefence on the testbed's multi-node Kubernetes (testbed/cluster) as it
// runs on bare metal: an etcd of its own, one or more coordinators in Kubernetes mode with a
// client certificate whose user is the ServiceAccount that deploy/'s RBAC binds (not
// system:masters), the IPMI fence-driver driving the nodes' BMCs, and one node-agent per node,
// started inside that node's network namespace as one of its services, in Kubernetes mode with a
// token of deploy/'s node-agent ServiceAccount bound to its Node (so deploy/'s admission policy
// confines it to its node's pods). Everything speaks mutual
// TLS with a certificate per component carrying its nodefence identity (services/identity) (so it dies with the node
// and starts again when the node boots). Every part is a real process of the binaries `make
// build` produces; BuildBinaries builds them for tests.
package nfcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/procs"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Namespace is where the coordinator's ConfigMaps and Secrets live (deploy/namespace.yaml).
const Namespace = "nodefence"

// CoordinatorUser is the user of the coordinator's client certificate: the ServiceAccount that
// deploy/rbac-coordinator.yaml binds.
const CoordinatorUser = "system:serviceaccount:nodefence:nodefence-coordinator"

// AgentServiceAccount is the node agents' ServiceAccount (deploy/rbac-node-agent.yaml); each
// agent's token is bound to its Node.
const AgentServiceAccount = "nodefence-node-agent"

// AgentTokenLifetime is how long an agent's token is valid: longer than any test or bench.
const AgentTokenLifetime = 24 * time.Hour

// AccessLog marks the gRPC servers' access-log lines, left out of log tails.
const AccessLog = `msg="finished call"`

// Binaries the deployment runs, from Options.BinDir.
var Binaries = []string{"coordinator", "node-agent", "fence-driver", "fencectl"}

// Options configure a deployment.
type Options struct {
	// BinDir holds Binaries. Required.
	BinDir string
	// Dir holds the deployment's data and logs. Required.
	Dir string
	// Coordinators is the number of coordinator replicas (default 1).
	Coordinators int
	// Grace is the coordinator's --node-monitor-grace-period (default 20s).
	Grace time.Duration
	// FenceTimeout is --fence-timeout (default 2s).
	FenceTimeout time.Duration
	// FenceOpTimeout, Retries and Backoff are --fence-op-timeout (default 10s), --fence-retries
	// (default 1) and --fence-retry-backoff (default 2s).
	FenceOpTimeout time.Duration
	Retries        int
	Backoff        time.Duration
	// CoordinatorArgs are extra coordinator flags (the pod-eviction budget), added after the
	// deployment's own.
	CoordinatorArgs []string
	// Shipped runs the coordinators with what deploy/coordinator.yaml passes and nothing else
	// (ShippedFlags: where things are, no lifecycle setting), so they decide on the shipped
	// defaults; Grace, FenceTimeout, FenceOpTimeout, Retries and Backoff are then ignored.
	// CoordinatorArgs are still added.
	Shipped bool
	// APIServer, when set, is the host:port the coordinators reach the apiserver at (a proxy in
	// front of it); they still verify the apiserver's own certificate.
	APIServer string
	// AgentArgs, when set, returns extra node-agent flags for a node (eviction thresholds, grant
	// timeout, shutdown grace periods), added after the deployment's own.
	AgentArgs func(n *cluster.Node) []string
	// BMCPort, when set, returns the port of the BMC that a node's fence configuration names (0:
	// the node's own BMC): a test maps a node to another machine's BMC, as a wrong mapping would.
	BMCPort func(n *cluster.Node) int
	// Watchdog, when set (whole seconds), gives every node a watchdog device with this timeout
	// (cluster.Node.StartWatchdog: unfed, it resets the node as its BMC's power-off and power-on
	// do) and starts the agents with --watchdog-device on it and --watchdog-timeout=Watchdog, each
	// answering the others' lease checks on its node's address (PeerPort) and asking theirs.
	// Stop removes the devices after the agents' clean stop. 0: no watchdog.
	Watchdog time.Duration
	// WatchdogFallback writes watchdog_fallback=true into every node's fence-config ConfigMap: a
	// power-off whose BMC does not answer falls back to the node's watchdog (proof by time).
	WatchdogFallback bool
	// Log receives progress (nil: discarded).
	Log *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Coordinators == 0 {
		o.Coordinators = 1
	}
	if o.Grace == 0 {
		o.Grace = 20 * time.Second
	}
	if o.FenceTimeout == 0 {
		o.FenceTimeout = 2 * time.Second
	}
	if o.FenceOpTimeout == 0 {
		o.FenceOpTimeout = 10 * time.Second
	}
	if o.Retries == 0 {
		o.Retries = 1
	}
	if o.Backoff == 0 {
		o.Backoff = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Deployment is nodefence running on a cluster.
type Deployment struct {
	Opts    Options
	Cluster *cluster.Cluster
	// Coordinators are the replicas, in start order.
	Coordinators []*Coordinator
	// DriverAddr is the IPMI fence-driver's address.
	DriverAddr string

	// OperatorTLS is the client certificate of an operator (operator/e2e), for fencectl and
	// the API calls of tests.
	OperatorTLS tlsfiles.Files

	etcd, driver *procs.Proc
	etcdURL      string
	ca           *certs.CA
	caFile       string
	// etcdClient is the coordinators' etcd client certificate, from etcd's own CA (as deploy/'s).
	etcdClient tlsfiles.Files
	// watchdogs are the nodes whose watchdog device the deployment started.
	watchdogs []*cluster.Node
}

// Coordinator is one coordinator replica.
type Coordinator struct {
	ID   string
	Addr string // on the cluster's host address, reachable from the nodes
	// AdmissionAddr is its node-agent admission webhook (deploy/webhook-node-agent.yaml).
	AdmissionAddr string
	p             *procs.Proc
	// log, bin and args start it again (Restart).
	log, bin string
	args     []string
}

// Log is the replica's log file.
func (c *Coordinator) Log() string { return c.p.Log }

// Kill SIGKILLs the replica and waits for it.
func (c *Coordinator) Kill() { c.p.Kill() }

// Alive reports whether the replica's process runs.
func (c *Coordinator) Alive() bool { exited, _ := c.p.Exited(); return !exited }

// DeployDir locates deploy/ from this source file.
func DeployDir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "deploy")
}

// BuildBinaries builds Binaries into dir with the go command, from the module this file is in.
func BuildBinaries(ctx context.Context, dir string) error {
	_, f, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(f), "..", "..")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/",
		"./coordinator/cmd/coordinator", "./node-agent/cmd/node-agent", "./fence-drivers/cmd/fence-driver", "./coordinator/cmd/fencectl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build nodefence binaries: %w: %s", err, out)
	}
	return nil
}

// Deploy starts nodefence on c and returns once a leader runs and every node's agent is connected
// and the node ready in its view.
func Deploy(ctx context.Context, c *cluster.Cluster, o Options) (*Deployment, error) {
	o.setDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "log"), 0o755); err != nil {
		return nil, err
	}
	d := &Deployment{Opts: o, Cluster: c}
	if err := d.newCA(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			d.Stop()
		}
	}()
	admin, err := c.Admin()
	if err != nil {
		return nil, err
	}
	kubeconfig, err := d.setupKube(ctx, admin)
	if err != nil {
		return nil, err
	}
	if err := d.startEtcd(); err != nil {
		return nil, err
	}
	if err := d.startDriver(); err != nil {
		return nil, err
	}
	for i := 1; i <= o.Coordinators; i++ {
		co, err := d.startCoordinator(i, kubeconfig)
		if err != nil {
			return nil, err
		}
		d.Coordinators = append(d.Coordinators, co)
	}
	if err := d.applyWebhook(ctx, admin); err != nil {
		return nil, err
	}
	var addrs []string
	for _, co := range d.Coordinators {
		addrs = append(addrs, co.Addr)
	}
	if err := d.startAgents(ctx, admin, addrs); err != nil {
		return nil, err
	}
	if err := d.WaitAgents(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// check names every option that is missing or out of range.
func (o Options) check() error {
	var errs []error
	if o.BinDir == "" || o.Dir == "" {
		errs = append(errs, errors.New("nfcluster options: BinDir and Dir are required"))
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("nfcluster options: BinDir: %s missing (make build)", b))
		}
	}
	if o.Coordinators < 1 || o.Coordinators > 3 {
		errs = append(errs, fmt.Errorf("nfcluster options: Coordinators: 1 to 3, got %d", o.Coordinators))
	}
	if w := o.Watchdog; w != 0 && (w < time.Second || w%time.Second != 0) {
		errs = append(errs, fmt.Errorf("nfcluster options: Watchdog: whole seconds, at least 1s, got %s", w))
	}
	return errors.Join(errs...)
}

// newCA takes the cluster's nodefence CA as the deployment's certificate authority (the apiserver
// verifies the authorization webhook's certificate with it) and issues the operator's certificate.
func (d *Deployment) newCA() error {
	ca, _ := d.Cluster.NodefenceCA()
	if ca == nil {
		return errors.New("the cluster has no nodefence CA")
	}
	var err error
	dir := filepath.Join(d.Opts.Dir, "pki")
	if d.caFile, _, err = ca.WriteCA(dir); err != nil {
		return err
	}
	d.ca = ca
	d.OperatorTLS, err = d.issue(identity.Operator, "e2e")
	return err
}

// issue writes a certificate for role/name, valid for 127.0.0.1 and the cluster's host address.
func (d *Deployment) issue(role identity.Role, name string) (tlsfiles.Files, error) {
	pair, err := d.ca.Issue(identity.Identity{Role: role, Name: name}, []string{"127.0.0.1", d.Cluster.HostIP().String()}, 24*time.Hour)
	if err != nil {
		return tlsfiles.Files{}, err
	}
	cert, key, err := pair.Write(filepath.Join(d.Opts.Dir, "pki"), string(role)+"-"+name)
	if err != nil {
		return tlsfiles.Files{}, err
	}
	return tlsfiles.Files{CertFile: cert, KeyFile: key, CAFile: d.caFile}, nil
}

// setupKube applies deploy/'s namespace, CRD and coordinator RBAC, issues the coordinator's
// client certificate, and writes the seed-format fence ConfigMaps of every node (BMC password in
// a Secret). It returns the coordinator's kubeconfig.
func (d *Deployment) setupKube(ctx context.Context, admin *kubernetes.Clientset) (string, error) {
	c := d.Cluster
	rc, err := cluster.RESTConfig(c.AdminKubeconfig())
	if err != nil {
		return "", err
	}
	a, err := kubetest.NewApplier(rc)
	if err != nil {
		return "", err
	}
	if err := a.ApplyFiles(ctx, DeployDir(), "namespace.yaml", "crd-nodefences.yaml", "crd-nodefenceremediations.yaml", "rbac-coordinator.yaml",
		"rbac-node-agent.yaml", "policy-node-agent.yaml"); err != nil {
		return "", err
	}
	if err := a.WaitForResource(ctx, kube.FenceResource); err != nil {
		return "", err
	}
	kc, err := c.IssueClient("nodefence-coordinator", CoordinatorUser, "system:serviceaccounts", "system:serviceaccounts:"+Namespace)
	if err != nil {
		return "", err
	}
	if d.Opts.APIServer != "" {
		if err := viaProxy(kc, d.Opts.APIServer, c.APIServerAddr().Addr().String()); err != nil {
			return "", err
		}
	}
	objs := []any{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bmc-credentials", Namespace: Namespace},
			StringData: map[string]string{"password": c.BMCPassword()}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-method-template-bmc", Namespace: Namespace},
			Data: map[string]string{"template.properties": "name=bmc\nagent_name=fence_ipmilan\nipaddr=127.0.0.1\nusername=" + cluster.BMCUser +
				"\npassword_secret=bmc-credentials/password\nlanplus=1\ncipher=3\nmust_sucess=yes\n"}},
	}
	fallback := ""
	if d.Opts.WatchdogFallback {
		fallback = "watchdog_fallback=true\n"
	}
	for _, n := range c.Nodes {
		port := n.BMC.Port
		if d.Opts.BMCPort != nil && d.Opts.BMCPort(n) != 0 {
			port = d.Opts.BMCPort(n)
		}
		objs = append(objs,
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-method-bmc-" + n.Name, Namespace: Namespace},
				Data: map[string]string{"method.properties": "template=fence-method-template-bmc\nipport=" + strconv.Itoa(port) + "\n"}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-config-" + n.Name, Namespace: Namespace},
				Data: map[string]string{"config.properties": "node_name=" + n.Name + "\npower_management=bmc\n" + fallback}})
	}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Secret:
			if _, err = admin.CoreV1().Secrets(Namespace).Update(ctx, o, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
				_, err = admin.CoreV1().Secrets(Namespace).Create(ctx, o, metav1.CreateOptions{})
			}
		case *corev1.ConfigMap:
			if _, err = admin.CoreV1().ConfigMaps(Namespace).Update(ctx, o, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
				_, err = admin.CoreV1().ConfigMaps(Namespace).Create(ctx, o, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return "", err
		}
	}
	return kc, nil
}

// viaProxy points the kubeconfig at addr, verifying the server's certificate for serverName.
func viaProxy(path, addr, serverName string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	for _, cl := range cfg.Clusters {
		cl.Server, cl.TLSServerName = "https://"+addr, serverName
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// AgentKubeconfig is the kubeconfig the node's agent runs with.
func (d *Deployment) AgentKubeconfig(node string) string {
	return filepath.Join(d.Opts.Dir, "agent-"+node+".kubeconfig")
}

// agentKubeconfig asks the apiserver for a token of the agents' ServiceAccount bound to n's Node
// object (TokenRequest), as production gives each agent its own: the token names the node (the
// user's extra authentication.kubernetes.io/node-name), which deploy/policy-node-agent.yaml
// checks, and dies with the Node. It writes the kubeconfig AgentKubeconfig names.
func (d *Deployment) agentKubeconfig(ctx context.Context, admin *kubernetes.Clientset, n *cluster.Node) (string, error) {
	node, err := admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("agent token of %s: %w", n.Name, err)
	}
	life := int64(AgentTokenLifetime / time.Second)
	tr, err := admin.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, AgentServiceAccount, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &life,
			BoundObjectRef: &authnv1.BoundObjectReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("agent token of %s: %w", n.Name, err)
	}
	rc, err := cluster.RESTConfig(d.Cluster.AdminKubeconfig())
	if err != nil {
		return "", err
	}
	user := "system:serviceaccount:" + Namespace + ":" + AgentServiceAccount
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"nodefence-testbed": {Server: rc.Host, CertificateAuthority: rc.CAFile}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: tr.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"nodefence-testbed": {Cluster: "nodefence-testbed", AuthInfo: user}},
		CurrentContext: "nodefence-testbed",
	}
	path := d.AgentKubeconfig(n.Name)
	return path, clientcmd.WriteToFile(cfg, path)
}

// Conn dials a coordinator replica as the operator.
func (d *Deployment) Conn(addr string) (coordv1.ClusterServiceClient, coordv1.FenceServiceClient, func(), error) {
	conn, err := dial.New(addr, d.OperatorTLS)
	if err != nil {
		return nil, nil, nil, err
	}
	return coordv1.NewClusterServiceClient(conn), coordv1.NewFenceServiceClient(conn), func() { conn.Close() }, nil
}

// Leader returns the live replica that answers ListNodes (followers refuse it), or nil.
func (d *Deployment) Leader(ctx context.Context) *Coordinator {
	for _, co := range d.Coordinators {
		if !co.Alive() {
			continue
		}
		cl, _, closeConn, err := d.Conn(co.Addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = cl.ListNodes(cctx, &coordv1.ListNodesRequest{})
		cancel()
		closeConn()
		if err == nil {
			return co
		}
	}
	return nil
}

// Nodes is the leader's view of the nodes.
func (d *Deployment) Nodes(ctx context.Context) ([]*coordv1.Node, error) {
	co := d.Leader(ctx)
	if co == nil {
		return nil, errors.New("no coordinator leads")
	}
	cl, _, closeConn, err := d.Conn(co.Addr)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	r, err := cl.ListNodes(ctx, &coordv1.ListNodesRequest{})
	return r.GetNodes(), err
}

// WaitAgents waits until a leader sees every running node's agent connected and the node ready.
func (d *Deployment) WaitAgents(ctx context.Context, timeout time.Duration) error {
	var last string
	deadline := time.Now().Add(timeout)
	for {
		if err := d.checkAlive(); err != nil {
			return err
		}
		nodes, err := d.Nodes(ctx)
		ready := map[string]bool{}
		for _, n := range nodes {
			ready[n.Name] = n.Connected && n.Readiness == coordv1.Readiness_READINESS_READY
		}
		var missing []string
		for _, n := range d.Cluster.Nodes {
			if n.Running() && !ready[n.Name] {
				missing = append(missing, n.Name)
			}
		}
		if err == nil && len(missing) == 0 {
			return nil
		}
		last = fmt.Sprintf("not connected and ready: %v (%v)", missing, err)
		if time.Now().After(deadline) {
			var tails []string
			for _, name := range missing {
				tails = append(tails, name+" node-agent log:\n"+procs.Tail(filepath.Join(d.Cluster.Node(name).Dir, "log", "node-agent.log"), 10))
			}
			for _, co := range d.Coordinators {
				tails = append(tails, co.ID+" log:\n"+procs.TailWithout(co.Log(), 15, AccessLog))
			}
			return fmt.Errorf("agents within %s: %s\n%s", timeout, last, strings.Join(tails, "\n"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// checkAlive fails with the log tail of the driver or etcd if either exited.
func (d *Deployment) checkAlive() error {
	for _, p := range []*procs.Proc{d.etcd, d.driver} {
		if p == nil {
			continue
		}
		if exited, _ := p.Exited(); exited {
			return p.Failure("exited")
		}
	}
	return nil
}

// Fencectl runs the fencectl binary against every replica (it finds the leader) with args.
func (d *Deployment) Fencectl(ctx context.Context, args ...string) (string, error) {
	var addrs []string
	for _, co := range d.Coordinators {
		addrs = append(addrs, co.Addr)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(d.Opts.BinDir, "fencectl"),
		append(append(pki.Args("", d.OperatorTLS), "--coordinator="+strings.Join(addrs, ","), "--timeout=20s"), args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Stop stops the agents (as node services: SIGTERM, a clean stop that disarms their watchdog),
// the watchdog devices it started, the coordinators, the driver and etcd, and removes the
// node-agent webhook that names a coordinator of this deployment.
func (d *Deployment) Stop() {
	d.removeWebhook()
	for _, n := range d.Cluster.Nodes {
		n.RemoveService("node-agent")
	}
	for _, n := range d.watchdogs {
		n.StopWatchdog()
	}
	for _, co := range d.Coordinators {
		co.p.Stop(5 * time.Second)
	}
	d.driver.Stop(5 * time.Second)
	d.etcd.Stop(5 * time.Second)
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func freePorts(host string, n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

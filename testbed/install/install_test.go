// Package install installs nodefence into the testbed's real multi-node Kubernetes
// (testbed/cluster) as an operator would with deploy/README.md, and proves it works as pods: the
// images `make images` builds are imported into every node's containerd, the certificates come
// from `fencectl certs` into Secrets (the path without cert-manager), nodefence is installed with
// one `kubectl apply -k testbed/overlays/cluster`; the agents' DaemonSet is rolled with a coordinator
// failover in the middle and nothing is fenced; then a node crashes and nodefence, running as pods,
// fences it through its BMC and releases its StatefulSet pod.
package install

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/nfcluster"
	"github.com/nodefence/nodefence/testbed/procs"
)

// clusterDir is the cluster's directory, fixed because the overlay's node agents read each node's
// files (its certificate, boot id, kubelet and containerd directories) under it.
const clusterDir = "/var/lib/nodefence-testbed"

// driverNode runs the IPMI driver (the overlay pins it there): never the victim.
const driverNode = "node-1"

// The cluster's lifecycle timing, the same as the overlay's coordinators.
const grace = 20 * time.Second

// repoRoot is the repository's root, from this file.
func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

// TestInstallCrash installs nodefence as pods with one kubectl apply -k and runs the crash
// scenario of testbed/clustere2e against it.
func TestInstallCrash(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the testbed cluster needs root (network namespaces, cgroups)")
	}
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(assets, kubetest.KubectlBinary)
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("%s missing: build it with `%s`", kubectl, kubetest.BuildCommand)
	}
	// In go test ./... other packages' clusters may hold the machine's cluster lock for minutes:
	// Up waits for it within StartTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	tmp := t.TempDir()

	// 1. Images, as `make images` builds them.
	imgDir := filepath.Join(tmp, "images")
	if err := buildImages(ctx, filepath.Join(tmp, "bin"), imgDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("images built after %s", time.Since(t0).Round(time.Millisecond))

	// 2. The cluster.
	c, err := cluster.Up(ctx, cluster.Config{Dir: clusterDir, NodeMonitorGracePeriod: grace, NodeMonitorPeriod: 2 * time.Second,
		StartTimeout: 12 * time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Down(); err != nil {
			t.Errorf("cluster down: %v", err)
		}
		left := c.Leftovers()
		if len(left) > 0 {
			t.Errorf("cluster left behind: %q", left)
		}
		// Its 2 GB go unless the test failed (logs kept) or anything is still mounted under it.
		if t.Failed() || len(left) > 0 {
			t.Logf("cluster directory kept: %s", clusterDir)
		} else if err := os.RemoveAll(clusterDir); err != nil {
			t.Errorf("remove %s: %v", clusterDir, err)
		}
	})
	t.Logf("cluster up after %s", time.Since(t0).Round(time.Millisecond))
	ents, err := os.ReadDir(imgDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		for _, e := range ents {
			sock := filepath.Join(n.Dir, "containerd.sock")
			if out, err := exec.CommandContext(ctx, "ctr", "-a", sock, "-n", "k8s.io", "images", "import", filepath.Join(imgDir, e.Name())).CombinedOutput(); err != nil {
				t.Fatalf("%s: ctr images import %s: %v\n%s", n.Name, e.Name(), err, out)
			}
		}
	}
	t.Logf("images imported into %d nodes after %s", len(c.Nodes), time.Since(t0).Round(time.Millisecond))

	// The BMCs listen on the host's loopback; the driver pod reaches them on the bridge's host
	// address, as a routed management network.
	for _, n := range c.Nodes {
		stop, err := relayUDP(net.JoinHostPort(c.HostIP().String(), strconv.Itoa(n.BMC.Port)), n.BMC.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}

	admin, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.RESTConfig(c.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(rc)
	k := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", c.AdminKubeconfig()}, args...)...)
		cmd.Dir = repoRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	// 3. Certificates without cert-manager (deploy/README.md), fence configuration.
	operator := issueCerts(t, ctx, c, filepath.Join(tmp, "bin", "fencectl"), filepath.Join(tmp, "pki"), k)
	writeFenceConfig(t, ctx, c, admin)

	// 4. The one command.
	out := k("apply", "-k", "testbed/overlays/cluster")
	t.Logf("kubectl apply -k testbed/overlays/cluster:\n%s", out)
	// Without cert-manager the node-agent webhook's caBundle is set by hand (deploy/README.md).
	pem, err := os.ReadFile(filepath.Join(tmp, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	k("patch", "validatingwebhookconfiguration", "nodefence-node-agent-own-node", "--type=json",
		"-p", `[{"op":"add","path":"/webhooks/0/clientConfig/caBundle","value":"`+base64.StdEncoding.EncodeToString(pem)+`"}]`)
	t.Cleanup(func() {
		if t.Failed() {
			dumpPods(t, admin, c)
		}
	})
	if err := waitPods(ctx, admin, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("every nodefence pod Running and Ready after %s", time.Since(t0).Round(time.Millisecond))
	leader, err := waitAgents(ctx, c, operator, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader on %s sees every agent connected after %s", leader, time.Since(t0).Round(time.Millisecond))

	// 4b. An upgrade of the agents (the DaemonSet rolled) with a coordinator failover in its middle:
	// nothing fenced.
	leader = rolloutAgents(t, ctx, c, admin, dyn, k, operator, leader)

	// 5. The crash scenario, with nodefence as pods. The victim runs neither the leader nor the
	// driver.
	var victim *cluster.Node
	for _, n := range c.Nodes {
		if n.Name != driverNode && n.Name != leader {
			victim = n
			break
		}
	}
	// The victim also hosts etcd's leader, so its crash costs etcd a leader election too (the
	// coordinators' watches and lease keepalives see it), as it does when the leader's node dies.
	if err := moveEtcdLeader(ctx, c, filepath.Join(tmp, "pki"), victim); err != nil {
		t.Fatal(err)
	}
	if leader, err = waitAgents(ctx, c, operator, time.Minute); err != nil {
		t.Fatalf("after etcd's leader moved to %s: %v", victim.Name, err)
	}
	if leader == victim.Name {
		t.Fatalf("the coordinators' leader moved to the victim %s", victim.Name)
	}
	w, err := nfcluster.CreateWriter(ctx, c, "crash", victim.Name)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := w.RunningPod(ctx, "", 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != victim.Name {
		t.Fatalf("the writer runs on %s, not on the victim %s it prefers", pod.Spec.NodeName, victim.Name)
	}
	waitLines(t, w, 3)
	if n := driverCalls(t, ctx, admin, "PowerOff"); n != 0 {
		t.Fatalf("the IPMI driver answered %d PowerOff calls before any node failed", n)
	}
	killed, err := victim.Crash()
	if err != nil {
		t.Fatal(err)
	}
	tc := time.Now()
	if got := power(t, ctx, c, victim); got != "on" {
		t.Fatalf("BMC after the crash says %q, want on (the crash must not touch power)", got)
	}
	newPod, err := w.RunningPod(ctx, pod.UID, 150*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if newPod.Spec.NodeName == victim.Name {
		t.Fatalf("the new pod runs on the victim %s", victim.Name)
	}
	t.Logf("crash of %s (%d processes killed) -> writer running on %s after %s", victim.Name, killed, newPod.Spec.NodeName, time.Since(tc).Round(time.Millisecond))
	if got := power(t, ctx, c, victim); got != "off" {
		t.Errorf("ipmitool says %s is %q after its pod was released, want off", victim.Name, got)
	}
	list, err := dyn.Resource(kube.FenceResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	confirmed := false
	for _, f := range list.Items {
		node, _, _ := unstructured.NestedString(f.Object, "spec", "node")
		off, _, _ := unstructured.NestedString(f.Object, "status", "confirmedOffAt")
		confirmed = confirmed || (node == victim.Name && off != "")
	}
	if !confirmed {
		t.Errorf("no NodeFence of %s with confirmedOffAt: %v", victim.Name, list.Items)
	}
	// The power-off went through the driver pod, called by a coordinator pod (nothing else holds a
	// coordinator certificate or reaches the driver).
	if n := driverCalls(t, ctx, admin, "PowerOff"); n == 0 {
		t.Errorf("the IPMI driver pod's log shows no PowerOff answered OK")
	} else {
		t.Logf("the IPMI driver pod answered %d PowerOff call(s) OK", n)
	}
	checkLog(t, w, newPod)
	for _, n := range c.Nodes {
		if n.Name != driverNode && n.Name != victim.Name {
			checkWebhookWithoutNode1(t, ctx, c, admin, n.Name)
			break
		}
	}
	logLeadership(t, c)
	t.Logf("install and crash scenario done in %s", time.Since(t0).Round(time.Millisecond))
}

// driverCalls counts the IPMI driver pod's access-log lines of method answered OK.
func driverCalls(t *testing.T, ctx context.Context, admin *kubernetes.Clientset, method string) int {
	t.Helper()
	pods, err := admin.CoreV1().Pods(nfcluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=ipmi"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the IPMI driver pod: %v (%d pods)", err, len(pods.Items))
	}
	raw, err := admin.CoreV1().Pods(nfcluster.Namespace).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("driver log: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, "finished call") && strings.Contains(l, method) &&
			(strings.Contains(l, `"grpc.code":"OK"`) || strings.Contains(l, "grpc.code=OK")) {
			n++
		}
	}
	return n
}

// moveEtcdLeader makes the etcd member on node n the leader (etcd's MoveLeader), as the
// coordinators' etcd client (their etcd certificate, from etcd's own CA).
func moveEtcdLeader(ctx context.Context, c *cluster.Cluster, pkiDir string, n *cluster.Node) error {
	tlsConf, err := tlsfiles.Files{CertFile: filepath.Join(pkiDir, "etcd-coordinator-nodefence-coordinator.crt"),
		KeyFile: filepath.Join(pkiDir, "etcd-coordinator-nodefence-coordinator.key"), CAFile: filepath.Join(pkiDir, "etcd-ca.crt")}.Client()
	if err != nil {
		return err
	}
	client := func(ip string) (*clientv3.Client, string, error) {
		ep := "https://" + net.JoinHostPort(ip, "2379")
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: tlsConf, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		return cli, ep, err
	}
	status := func(ip string) (member, leader uint64, err error) {
		cli, ep, err := client(ip)
		if err != nil {
			return 0, 0, err
		}
		defer cli.Close()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		st, err := cli.Status(sctx, ep)
		if err != nil {
			return 0, 0, fmt.Errorf("etcd status at %s: %w", ep, err)
		}
		return st.Header.MemberId, st.Leader, nil
	}
	target, leader, err := status(n.IP.String())
	if err != nil {
		return err
	}
	if target == leader {
		return nil
	}
	for _, o := range c.Nodes {
		id, _, err := status(o.IP.String())
		if err != nil {
			return err
		}
		if id != leader {
			continue
		}
		cli, _, err := client(o.IP.String())
		if err != nil {
			return err
		}
		defer cli.Close()
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := cli.MoveLeader(mctx, target); err != nil {
			return fmt.Errorf("etcd move leader from %s to %s: %w", o.Name, n.Name, err)
		}
		if _, now, err := status(n.IP.String()); err != nil || now != target {
			return fmt.Errorf("etcd's leader after the move: %x, want %s's %x (%v)", now, n.Name, target, err)
		}
		return nil
	}
	return fmt.Errorf("etcd's leader %x is on no node", leader)
}

// power reads the node's power state with ipmitool, independently of nodefence.
func power(t *testing.T, ctx context.Context, c *cluster.Cluster, n *cluster.Node) string {
	t.Helper()
	got, err := ipmisim.IpmitoolPower(ctx, n.BMC.Port, cluster.BMCUser, c.BMCPassword())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitLines(t *testing.T, w *nfcluster.Writer, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines, _ := w.Lines()
		if len(lines) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer log has %d lines, want %d", len(lines), n)
		}
	}
}

// checkLog verifies the writer log: never two writers, and the new pod found the old one's data.
func checkLog(t *testing.T, w *nfcluster.Writer, newPod *corev1.Pod) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines, err := w.Lines()
		if err != nil {
			t.Fatal(err)
		}
		eps, err := nfcluster.CheckOneWriter(lines)
		if err != nil {
			t.Fatalf("writer log: %v", err)
		}
		if last := eps[len(eps)-1]; last.UID == string(newPod.UID) && last.Lines >= 3 {
			if last.Found <= eps[0].Lines {
				t.Errorf("the new pod found %d lines, want more than the first pod's %d", last.Found, eps[0].Lines)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new pod %s is not writing: episodes %+v", newPod.UID, eps)
		}
	}
}

// logLeadership logs the coordinator pods' election lines (who led when, and why a term ended).
func logLeadership(t *testing.T, c *cluster.Cluster) {
	for _, n := range c.Nodes {
		logs, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", nfcluster.Namespace+"_nodefence-coordinator-*", "*", "*.log"))
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			for _, line := range strings.Split(string(data), "\n") {
				i := strings.Index(line, "msg=")
				if i >= 0 && (strings.Contains(line, "became leader") || strings.Contains(line, "leadership") || strings.Contains(line, "stepping down")) {
					t.Logf("%s: %s", n.Name, line[i:])
				}
			}
		}
	}
}

// dumpPods logs where nodefence's pods are and the tail of each one's log.
func dumpPods(t *testing.T, admin *kubernetes.Clientset, c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := admin.CoreV1().Pods(nfcluster.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		var states []string
		for _, s := range p.Status.ContainerStatuses {
			states = append(states, fmt.Sprintf("%s ready=%v restarts=%d %+v", s.Name, s.Ready, s.RestartCount, s.State))
		}
		t.Logf("pod %s on %s: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, states)
		n := c.Node(p.Spec.NodeName)
		if n == nil {
			continue
		}
		logs, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", nfcluster.Namespace+"_"+p.Name+"_*", "*", "*.log"))
		for _, l := range logs {
			t.Logf("%s:\n%s", l, procs.TailWithout(l, 15, nfcluster.AccessLog))
		}
	}
}

package install

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/images"
	"github.com/nodefence/nodefence/testbed/nfcluster"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// buildImages builds the binaries as `make images` does (static, trimmed) into bin and writes the
// OCI tarballs, tagged testbed, into out.
func buildImages(ctx context.Context, bin, out string) error {
	root := repoRoot()
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	for _, b := range [][2]string{{"coordinator", "coordinator"}, {"node-agent", "node-agent"}, {"fence-driver", "fence-drivers"}, {"fencectl", "coordinator"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", filepath.Join(bin, b[0]), "./"+b[1]+"/cmd/"+b[0])
		cmd.Dir, cmd.Env = root, env
		if o, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b[0], err, o)
		}
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", filepath.Join(bin, "etcd"), ".")
	cmd.Dir, cmd.Env = filepath.Join(root, "testbed", "kube", "tools", "etcd"), append(env, "GOWORK=off")
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build etcd: %w\n%s", err, o)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	o := images.Options{Version: "testbed", BinDir: bin, Created: time.Unix(0, 0).UTC(), GzipLevel: 1}
	specs, err := images.Specs(o)
	if err != nil {
		return err
	}
	for _, s := range specs {
		img, err := images.Build(s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Ref(), err)
		}
		if err := images.WriteOCI(img, s.Ref(), filepath.Join(out, strings.ReplaceAll(s.Name, "/", "-")+".oci.tar"), o.Created); err != nil {
			return fmt.Errorf("%s: %w", s.Ref(), err)
		}
	}
	return nil
}

// nodeIPs are the nodes' addresses, where the overlay's hostNetwork servers listen.
func nodeIPs(c *cluster.Cluster) []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.IP.String())
	}
	return out
}

// issueCerts follows deploy/README.md's path without cert-manager: fencectl certs issues the CA
// and every component's certificate, kubectl puts them in the Secrets deploy/ mounts, and each
// node gets its own agent certificate on its own disk. It returns the operator's certificate.
func issueCerts(t *testing.T, ctx context.Context, c *cluster.Cluster, fencectl, dir string, k func(...string) string) tlsfiles.Files {
	t.Helper()
	ips := strings.Join(nodeIPs(c), ",")
	fc := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, fencectl, append([]string{"certs", "--dir", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("fencectl certs %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	withCA := []string{"--ca-cert", p("ca.crt"), "--ca-key", p("ca.key")}
	// The Service name too: the apiserver calls the admission webhook through the Service and
	// verifies that name (deploy/webhook-node-agent.yaml).
	fc("--hosts", ips+",nodefence-coordinator.nodefence.svc", "coordinator/nodefence-coordinator")
	fc(append(withCA, "--hosts", nodeIPs(c)[0], "driver/nodefence-fence-driver")...)
	agents := []string{"operator/e2e"}
	for _, n := range c.Nodes {
		agents = append(agents, "agent/"+n.Name)
	}
	fc(append(withCA, agents...)...)
	// etcd's own CA, its members' certificate and the coordinators' etcd client certificate
	// (deploy/README.md): etcd trusts no certificate of the nodefence CA.
	fc(append([]string{"--etcd", "--hosts", ips}, "member/nodefence-etcd", "coordinator/nodefence-coordinator")...)
	k("apply", "-f", "deploy/namespace.yaml")
	tlsSecret := func(name, base, ca string) {
		k("-n", nfcluster.Namespace, "create", "secret", "generic", name, "--from-file=tls.crt="+p(base+".crt"),
			"--from-file=tls.key="+p(base+".key"), "--from-file=ca.crt="+p(ca))
	}
	tlsSecret("nodefence-coordinator-tls", "coordinator-nodefence-coordinator", "ca.crt")
	tlsSecret("nodefence-coordinator-etcd-tls", "etcd-coordinator-nodefence-coordinator", "etcd-ca.crt")
	tlsSecret("nodefence-fence-driver-tls", "driver-nodefence-fence-driver", "ca.crt")
	tlsSecret("nodefence-etcd-tls", "etcd-member-nodefence-etcd", "etcd-ca.crt")
	k("-n", nfcluster.Namespace, "create", "secret", "generic", "nodefence-fence-credentials", "--from-literal=none=")
	for _, n := range c.Nodes {
		d := filepath.Join(n.Dir, "nodefence-tls")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for dst, src := range map[string]string{"tls.crt": "agent-" + n.Name + ".crt", "tls.key": "agent-" + n.Name + ".key", "ca.crt": "ca.crt"} {
			data, err := os.ReadFile(p(src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, dst), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return tlsfiles.Files{CertFile: p("operator-e2e.crt"), KeyFile: p("operator-e2e.key"), CAFile: p("ca.crt")}
}

// writeFenceConfig writes each node's fence ConfigMaps in the seed's format: IPMI through the
// node's BMC at the bridge's host address, its password in a Secret.
func writeFenceConfig(t *testing.T, ctx context.Context, c *cluster.Cluster, admin *kubernetes.Clientset) {
	t.Helper()
	ns := nfcluster.Namespace
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bmc-credentials", Namespace: ns},
		StringData: map[string]string{"password": c.BMCPassword()}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "fence-method-template-bmc", Namespace: ns},
		Data: map[string]string{"template.properties": "name=bmc\nagent_name=fence_ipmilan\nipaddr=" + c.HostIP().String() + "\nusername=" + cluster.BMCUser +
			"\npassword_secret=bmc-credentials/password\nlanplus=1\ncipher=3\nmust_sucess=yes\n"}}}
	for _, n := range c.Nodes {
		cms = append(cms,
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-method-bmc-" + n.Name, Namespace: ns},
				Data: map[string]string{"method.properties": "template=fence-method-template-bmc\nipport=" + strconv.Itoa(n.BMC.Port) + "\n"}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-config-" + n.Name, Namespace: ns},
				Data: map[string]string{"config.properties": "node_name=" + n.Name + "\npower_management=bmc\n"}})
	}
	for _, cm := range cms {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitPods waits until nodefence's pods are Running and Ready: 3 etcd members, 3 coordinators,
// the IPMI driver and one agent per node.
func waitPods(ctx context.Context, admin *kubernetes.Clientset, timeout time.Duration) error {
	want := map[string]int{"nodefence-etcd": 3, "nodefence-coordinator": 3, "nodefence-fence-driver": 1, "nodefence-node-agent": 3}
	var last map[string]int
	for deadline := time.Now().Add(timeout); ; {
		pods, err := admin.CoreV1().Pods(nfcluster.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		last = map[string]int{}
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil && w.Reason == "ErrImageNeverPull" {
					return fmt.Errorf("pod %s on %s: %s", p.Name, p.Spec.NodeName, w.Message)
				}
			}
			if p.Status.Phase == corev1.PodRunning && podReady(&p) {
				last[p.Labels["app.kubernetes.io/name"]]++
			}
		}
		done := true
		for k, n := range want {
			done = done && last[k] == n
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodefence pods Running and Ready within %s: %v, want %v", timeout, last, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitAgents waits until one coordinator leads (answers ListNodes) and sees every node's agent
// connected and the node ready; it returns the leader's node.
func waitAgents(ctx context.Context, c *cluster.Cluster, operator tlsfiles.Files, timeout time.Duration) (string, error) {
	var last string
	for deadline := time.Now().Add(timeout); ; {
		for _, n := range c.Nodes {
			nodes, err := listNodes(ctx, net.JoinHostPort(n.IP.String(), "7001"), operator)
			if err != nil {
				last = fmt.Sprintf("%s: %v", n.Name, err)
				continue
			}
			ready := 0
			for _, nn := range nodes {
				if nn.Connected && nn.Readiness == coordv1.Readiness_READINESS_READY {
					ready++
				}
			}
			if ready == len(c.Nodes) {
				return n.Name, nil
			}
			last = fmt.Sprintf("leader on %s: %d of %d nodes connected and ready: %v", n.Name, ready, len(c.Nodes), nodes)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("agents within %s: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func listNodes(ctx context.Context, addr string, operator tlsfiles.Files) ([]*coordv1.Node, error) {
	conn, err := dial.New(addr, operator)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := coordv1.NewClusterServiceClient(conn).ListNodes(cctx, &coordv1.ListNodesRequest{})
	return r.GetNodes(), err
}

package nodeagent

import (
	"bytes"
	"context"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/containerdtest"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// granter is a real AgentService that acks everything, answers every eviction candidate with a
// grant when grant is set, and records the eviction reports.
type granter struct {
	agentv1.UnimplementedAgentServiceServer
	grant bool

	mu      sync.Mutex
	reports []*agentv1.EvictionReport
}

func (g *granter) Connect(st agentv1.AgentService_ConnectServer) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
		if c := m.GetCandidates(); c != nil && g.grant {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Grant{Grant: &agentv1.EvictionGrant{
				Signal: c.Signal, Pods: c.Candidates}}}); err != nil {
				return err
			}
		}
		if r := m.GetEviction(); r != nil {
			g.mu.Lock()
			g.reports = append(g.reports, r)
			g.mu.Unlock()
		}
	}
}

func (g *granter) kinds() []agentv1.EvictionKind {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []agentv1.EvictionKind
	for _, r := range g.reports {
		out = append(out, r.Kind)
	}
	return out
}

// agentKubeconfig applies deploy/'s namespace and agent RBAC to c and writes a kubeconfig of the
// agent's ServiceAccount.
func agentKubeconfig(ctx context.Context, t *testing.T, c *kubetest.Cluster) string {
	t.Helper()
	a, err := kubetest.NewApplier(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"namespace.yaml", "rbac-node-agent.yaml"} {
		objs, err := kubetest.ReadObjects(filepath.Join("../../deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if _, err := a.Apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	rc, err := c.ServiceAccountConfig(ctx, "nodefence", "nodefence-node-agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitForClusterRole(ctx, "nodefence-node-agent", "nodefence", "nodefence-node-agent"); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// runAgent runs the binary's run against g with extra flags until the test ends.
func runAgent(ctx context.Context, t *testing.T, g *granter, node, kubeconfig string, extra ...string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, g)
	go func() { _ = srv.Serve(lis) }()
	rctx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	args := append([]string{
		"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=" + node, "--boot-id-file=" + bootID(t),
		"--proc-root=../signals/testdata/proc", "--cgroup-root=../signals/testdata/v1", "--cgroup-version=1",
		"--nodefs-path=" + t.TempDir(), "--kubeconfig=" + kubeconfig, "--housekeeping-interval=200ms", "--memory-fast-interval=0",
	}, extra...)
	go func() { done <- Main(rctx, args, io.Discard, &stderr) }()
	t.Cleanup(func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("exit %d:\n%s", code, stderr.String())
		}
		srv.Stop()
	})
}

func createHog(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string) *corev1.Pod {
	t.Helper()
	grace := int64(30)
	pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog-" + node},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/hog:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestRunKubernetesModeEvicts runs the binary with --kubeconfig as the agent's ServiceAccount
// (deploy/'s RBAC) against a real apiserver, with thresholds the test data always meets:
//   - soft threshold, coordinator grants: the pod is evicted through the Eviction API with the soft
//     grace period (min of the pod's 30 s and --eviction-max-pod-grace-period 3) and a GRANTED report;
//   - soft threshold, no grant within --eviction-grant-timeout: local fallback (Failed/Evicted) and a
//     FALLBACK report;
//   - hard threshold: evicted at once locally, with a HARD report.
func TestRunKubernetesModeEvicts(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	kubeconfig := agentKubeconfig(ctx, t, c)
	admin := c.Clientset()
	get := func(name string) *corev1.Pod {
		p, err := admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return p
	}
	soft := []string{"--eviction-hard=memory.available<1", "--eviction-soft=memory.available<1Ei",
		"--eviction-soft-grace-period=memory.available=1s", "--eviction-max-pod-grace-period=3"}

	t.Run("granted", func(t *testing.T) {
		g := &granter{grant: true}
		createHog(ctx, t, admin, "node-g")
		runAgent(ctx, t, g, "node-g", kubeconfig, soft...)
		waitUntil(ctx, t, "the granted pod to be Terminating", func() bool {
			p := get("hog-node-g")
			return p != nil && p.DeletionTimestamp != nil && *p.DeletionGracePeriodSeconds == 3
		})
		waitUntil(ctx, t, "a GRANTED report", func() bool {
			return slices.Contains(g.kinds(), agentv1.EvictionKind_EVICTION_KIND_GRANTED)
		})
		if p := get("hog-node-g"); p.Status.Phase == corev1.PodFailed {
			t.Errorf("a granted eviction went around the Eviction API: %+v", p.Status)
		}
		if k := g.kinds(); slices.Contains(k, agentv1.EvictionKind_EVICTION_KIND_FALLBACK) || slices.Contains(k, agentv1.EvictionKind_EVICTION_KIND_HARD) {
			t.Errorf("reports %v; a granted candidate must not be evicted locally", k)
		}
	})
	t.Run("fallback", func(t *testing.T) {
		g := &granter{}
		createHog(ctx, t, admin, "node-f")
		runAgent(ctx, t, g, "node-f", kubeconfig, append(soft, "--eviction-grant-timeout=1s")...)
		waitUntil(ctx, t, "the pod to be evicted locally", func() bool {
			p := get("hog-node-f")
			return p != nil && p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted"
		})
		waitUntil(ctx, t, "a FALLBACK report", func() bool {
			return slices.Contains(g.kinds(), agentv1.EvictionKind_EVICTION_KIND_FALLBACK)
		})
	})
	t.Run("disk pressure: image GC through CRI first", func(t *testing.T) {
		ctd := containerdtest.Start(t)
		ctd.ImportImage(t, "nodefence.test/unused:1", 1<<20)
		g := &granter{grant: true}
		createHog(ctx, t, admin, "node-d")
		runAgent(ctx, t, g, "node-d", kubeconfig, "--eviction-hard=nodefs.available<1Ei,imagefs.available<1Ei",
			"--container-runtime-endpoint="+ctd.Endpoint(), "--image-minimum-gc-age=0")
		waitUntil(ctx, t, "the unused image to be removed", func() bool {
			out, err := exec.Command("ctr", "--address", ctd.Socket, "--namespace", "k8s.io", "images", "ls", "-q").Output()
			return err == nil && len(bytes.TrimSpace(out)) == 0
		})
		// A threshold of 1Ei stays met: after the reclaim the pod is evicted.
		waitUntil(ctx, t, "the pod to be evicted locally", func() bool {
			p := get("hog-node-d")
			return p != nil && p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodFailed
		})
	})
	t.Run("hard", func(t *testing.T) {
		g := &granter{grant: true}
		createHog(ctx, t, admin, "node-h")
		runAgent(ctx, t, g, "node-h", kubeconfig, "--eviction-hard=memory.available<1Ei")
		waitUntil(ctx, t, "the pod to be evicted locally", func() bool {
			p := get("hog-node-h")
			return p != nil && p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodFailed && *p.DeletionGracePeriodSeconds == 1
		})
		waitUntil(ctx, t, "a HARD report", func() bool {
			return slices.Contains(g.kinds(), agentv1.EvictionKind_EVICTION_KIND_HARD)
		})
	})
}

package kubepods

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// One real apiserver for the package. deploy/'s namespace and node-agent RBAC are applied to it
// for real, and the code under test runs as the agent's ServiceAccount; the admin only sets the
// scene (pods, PriorityClasses, PodDisruptionBudgets, what a kubelet or controller would write).
var (
	cluster  *kubetest.Cluster
	agentCfg *rest.Config // the nodefence-node-agent ServiceAccount, with deploy/'s RBAC only
	admin    *kubernetes.Clientset
)

const deployDir = "../../deploy"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	start := time.Now()
	c, err := kubetest.New("")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: kube test cluster:", err)
		return 1
	}
	defer c.Stop()
	cluster, admin = c, c.Clientset()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = installAgentRBAC(ctx, c)
	if err == nil {
		agentCfg, err = c.ServiceAccountConfig(ctx, "nodefence", "nodefence-node-agent")
	}
	if err == nil {
		err = c.WaitForClusterRole(ctx, "nodefence-node-agent", "nodefence", "nodefence-node-agent")
	}
	if err == nil {
		err = createPriorityClasses(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setting up the cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kube test cluster at %s ready in %s\n", c.Host, time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// installAgentRBAC applies deploy/'s namespace and the node agent's RBAC.
func installAgentRBAC(ctx context.Context, c *kubetest.Cluster) error {
	a, err := kubetest.NewApplier(c.Config())
	if err != nil {
		return err
	}
	return a.ApplyFiles(ctx, deployDir, "namespace.yaml", "rbac-node-agent.yaml")
}

// The PriorityClasses the tests' pods use (system-node-critical is built in).
var priorityClasses = map[string]int32{"nf-mid": 10000, "nf-high": 100000}

func createPriorityClasses(ctx context.Context) error {
	for name, v := range priorityClasses {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: v}
		if _, err := admin.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// agentClient is a clientset with the agent's RBAC; wrap, when set, sees every request.
func agentClient(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) *Client {
	t.Helper()
	cfg := rest.CopyConfig(agentCfg)
	cfg.WrapTransport = wrap
	cs, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// namespace creates a fresh namespace (never deleted: a bare apiserver cannot finish deleting one).
func namespace(ctx context.Context, t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: strings.TrimSuffix(name, "-") + "-"}}
	got, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Name
}

// podSpec describes a test pod.
type podSpec struct {
	name, node, priorityClass string
	requests, limits          corev1.ResourceList
	daemonSet, mirror         bool
	labels                    map[string]string
	grace                     int64
}

// createPod creates the pod as the admin (as the scheduler or kubelet would have) and marks it
// Running and Ready, as a kubelet would.
func createPod(ctx context.Context, t *testing.T, ns string, s podSpec) *corev1.Pod {
	t.Helper()
	grace := s.grace
	if grace == 0 {
		grace = 30
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name, Labels: s.labels},
		Spec: corev1.PodSpec{NodeName: s.node, PriorityClassName: s.priorityClass, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
				Resources: corev1.ResourceRequirements{Requests: s.requests, Limits: s.limits}}}},
	}
	if s.daemonSet {
		yes := true
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "node-agent", UID: "ds-uid", Controller: &yes}}
	}
	if s.mirror {
		pod.Annotations = map[string]string{ConfigMirrorAnnotation: "hash", ConfigSourceAnnotation: "file", "kubernetes.io/config.hash": "hash"}
	}
	got, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", s.name, err)
	}
	if s.node == "" {
		return got
	}
	got.Status.Phase = corev1.PodRunning
	got.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	got, err = admin.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("pod %s status: %v", s.name, err)
	}
	return got
}

// eventually polls cond every 20ms until it holds or ctx ends.
func eventually(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// requestLog records the method and path of every request.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, r.Method+" "+r.URL.Path)
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// count returns how many requests had this method and a path ending in suffix.
func (l *requestLog) count(method, suffix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.reqs {
		m, p, _ := strings.Cut(r, " ")
		if m == method && strings.HasSuffix(p, suffix) {
			n++
		}
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// local is p as the agent reads it (its own Pod type), through the API's JSON.
func local(t *testing.T, p *corev1.Pod) *Pod {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var out Pod
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

package kubetest

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/testbed/gomod"
)

// The cache key must tell the truth: the tool modules require exactly the versions named here.
func TestToolModuleVersions(t *testing.T) {
	for _, tl := range tools("../tools") {
		if err := gomod.Requires(tl.dir+"/go.mod", tl.module, tl.version); err != nil {
			t.Error(err)
		}
	}
	if err := gomod.Requires("../tools/etcd/go.mod", "go.etcd.io/etcd/server/v3", "v3.6.0"); err == nil {
		t.Error("gomod.Requires accepted a wrong version")
	}
}

func TestMissingBinariesNameTheBuildCommand(t *testing.T) {
	t.Setenv(AssetsEnv, t.TempDir())
	_, err := New("")
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), BuildCommand) {
		t.Fatalf("New without binaries: %v; want ErrNoBinaries naming %q", err, BuildCommand)
	}
}

func TestCluster(t *testing.T) {
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Clientset().CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("admin: %v", err)
	}
	// A reader of pods may read pods, and may not write ConfigMaps. (The built-in "view" role is
	// aggregated by kube-controller-manager, which a bare apiserver lacks: it has no rules here.)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}}
	if _, err := c.Clientset().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ConfigForClusterRole(ctx, "pod-reader", "kubetest", "viewer")
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("viewer lists pods: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("viewer creates a ConfigMap: %v, want Forbidden", err)
	}

	pids := []int{c.api.cmd.Process.Pid, c.etcd.cmd.Process.Pid}
	c.Stop()
	c.Stop()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still there after Stop: %v", pid, err)
		}
	}
}

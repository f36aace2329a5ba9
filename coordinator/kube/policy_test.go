package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// TestKubeletCannotExcludeItsNode: deploy/policy-node-fencing-controls.yaml on the real apiserver.
// A kubelet (a user of the group system:nodes) may update its Node — a label of its own goes
// through — but may not add, change or remove nodefence.io/exclude-from-fencing or
// nodefence.io/fence-mode, on update or at registration; an administrator may. (The test cluster
// authorizes with RBAC only, so a ClusterRole stands in for the Node authorizer's grant.)
func TestKubeletCannotExcludeItsNode(t *testing.T) {
	ctx := testContext(t)
	const name = "policy-node"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	grantNodes(ctx, t)
	a, err := kubetest.NewApplier(cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyFiles(ctx, deployDir, "policy-node-fencing-controls.yaml"); err != nil {
		t.Fatal(err)
	}
	rc := rest.CopyConfig(cluster.Config())
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
	kubelet := kubernetes.NewForConfigOrDie(rc)
	patch := func(c kubernetes.Interface, p string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	const (
		exclude  = `{"metadata":{"labels":{"nodefence.io/exclude-from-fencing":""}}}`
		include  = `{"metadata":{"labels":{"nodefence.io/exclude-from-fencing":null}}}`
		observe  = `{"metadata":{"annotations":{"nodefence.io/fence-mode":"observe"}}}`
		enforce  = `{"metadata":{"annotations":{"nodefence.io/fence-mode":null}}}`
		ownLabel = `{"metadata":{"labels":{"example.com/rack":"r7"}}}`
		maintain = `{"metadata":{"annotations":{"nodefence.io/maintenance":"kernel upgrade"}}}`
	)
	// The policy takes effect a moment after it is created: until the kubelet's change is refused,
	// an administrator undoes it and the kubelet tries again.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := patch(kubelet, observe)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "a node does not decide whether it is fenced") {
			break
		}
		if err != nil && !apierrors.IsForbidden(err) {
			t.Fatal(err)
		}
		if err := patch(admin, enforce); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kubelet's fence-mode annotation was never refused: %v", err)
		}
	}
	if err := patch(kubelet, exclude); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet adds the exclusion label: %v, want Forbidden", err)
	}
	if err := patch(kubelet, maintain); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet puts its node in maintenance: %v, want Forbidden", err)
	}
	if err := patch(kubelet, `{"metadata":{"annotations":{"nodefence.io/maintenance-state":"{\"cordoned\":true}"}}}`); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet writes nodefence's maintenance record: %v, want Forbidden", err)
	}
	if err := patch(kubelet, ownLabel); err != nil {
		t.Fatalf("kubelet's own label: %v", err)
	}
	if err := patch(admin, exclude); err != nil {
		t.Fatalf("administrator adds the exclusion label: %v", err)
	}
	if err := patch(admin, observe); err != nil {
		t.Fatalf("administrator adds the fence-mode annotation: %v", err)
	}
	if err := patch(kubelet, include); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet removes the exclusion label: %v, want Forbidden", err)
	}
	if err := patch(kubelet, `{"metadata":{"annotations":{"nodefence.io/fence-mode":"enforce"}}}`); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet changes the fence-mode annotation: %v, want Forbidden", err)
	}
	if err := patch(kubelet, maintain); !apierrors.IsForbidden(err) {
		t.Fatalf("kubelet puts its node in maintenance: %v, want Forbidden", err)
	}
	if err := patch(kubelet, ownLabel); err != nil {
		t.Fatalf("kubelet's own label on an excluded node: %v", err)
	}
	// Nor through the status subresource, which the kubelet writes every few seconds.
	if err := patch(admin, include); err != nil {
		t.Fatal(err)
	}
	_, err = kubelet.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(exclude), metav1.PatchOptions{}, "status")
	n, gerr := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if _, ok := n.Labels[LabelExcludeFencing]; ok {
		t.Fatalf("kubelet set the exclusion label through nodes/status (%v)", err)
	}
	t.Logf("the exclusion label through nodes/status: %v", err)
	// At registration too: a kubelet's --node-labels cannot carry the exclusion.
	_, err = kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "policy-node-2",
		Labels: map[string]string{LabelExcludeFencing: "yes"}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		_ = admin.CoreV1().Nodes().Delete(ctx, "policy-node-2", metav1.DeleteOptions{})
		t.Fatalf("kubelet registers an excluded Node: %v, want Forbidden", err)
	}
}

// grantNodes lets the group system:nodes read, create and update Nodes, as the Node authorizer
// lets each kubelet with its own Node.
func grantNodes(ctx context.Context, t *testing.T) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-kubelets-nodes"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"}, Verbs: []string{"get", "create", "update", "patch"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-kubelets-nodes"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

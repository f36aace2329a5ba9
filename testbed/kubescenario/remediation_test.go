package kubescenario

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/testlog"
)

// remediationNS is where the health checker's template lives, so where it creates remediations.
const remediationNS = "medik8s"

// The NodeHealthCheck contract, driven as NHC drives a remediator: a NodeFenceRemediationTemplate
// exists; for an unhealthy node NHC creates a NodeFenceRemediation named after the node (spec
// copied from the template), waits for the Processing and Succeeded conditions, marks one it gives
// up on with the nhc-timed-out annotation, and deletes them once the node is healthy. nodefence:
//   - a node it still hears (both witnesses report): Succeeded=False WitnessesReport at once, so
//     NHC escalates to its next remediator; nothing is fenced;
//   - a dead node: fenced by nodefence's own rules, Succeeded=True once confirmed off and proven
//     dark, status.fence naming the record, the pod released;
//   - timed out: Processing=False, Succeeded=False TimedOut;
//   - it never deletes a remediation; NHC's delete is final (nothing recreated).
func TestNodeHealthCheckContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 2, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if _, err := env.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: remediationNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nodefence.io/v1alpha1", "kind": "NodeFenceRemediationTemplate",
		"metadata": map[string]any{"name": "nodefence", "namespace": remediationNS},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{}}},
	}}
	templates := kube.RemediationResource.GroupVersion().WithResource("nodefenceremediationtemplates")
	if _, err := dyn.Resource(templates).Namespace(remediationNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the NHC-shaped template: %v", err)
	}
	rems := dyn.Resource(kube.RemediationResource).Namespace(remediationNS)
	create := func(node string) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "nodefence.io/v1alpha1", "kind": kube.RemediationKind,
			"metadata": map[string]any{"name": node, "namespace": remediationNS},
			"spec":     map[string]any{}, // NHC copies the template's spec.template.spec
		}}
		if _, err := rems.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create remediation %s: %v", node, err)
		}
	}
	healthy, victim := env.Nodes[0], env.Nodes[2]

	// A node nodefence still hears: refused at once, so NHC can escalate.
	create(healthy.Name)
	c := waitCondition(t, ctx, rems, healthy.Name, kube.ConditionSucceeded, metav1.ConditionFalse)
	if c.Reason != kube.ReasonWitnessesReport {
		t.Fatalf("%s: Succeeded=False for %q (%s), want %s", healthy.Name, c.Reason, c.Message, kube.ReasonWitnessesReport)
	}
	if fs := env.Fences(ctx, healthy.Name); len(fs) != 0 {
		t.Fatalf("%s fenced on a remediation while its witnesses report: %v", healthy.Name, fs)
	}

	// Cluster API: the remediation is named after a Machine that owns it; the node is the Machine's
	// status.nodeRef.
	machineRemediation(t, ctx, env, dyn, "md-0-abc12", env.Nodes[1].Name)

	// A dead node: fenced by nodefence's rules, Succeeded once proven.
	create(victim.Name)
	env.Fail(victim)
	c = waitCondition(t, ctx, rems, victim.Name, kube.ConditionSucceeded, metav1.ConditionTrue)
	u, err := rems.Get(ctx, victim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fence, _, _ := unstructured.NestedString(u.Object, "status", "fence")
	fs := env.Fences(ctx, victim.Name)
	if len(fs) != 1 || fs[0].Id != fence || fs[0].ConfirmedOffAt == nil {
		t.Fatalf("status.fence %q, records %v: want the one confirmed record", fence, fs)
	}
	if p := processing(u); p != metav1.ConditionFalse {
		t.Errorf("Processing=%s after Succeeded, want False", p)
	}
	t.Logf("%s: Succeeded=True (%s): %s", victim.Name, c.Reason, c.Message)
	if p, err := ipmisim.IpmitoolPower(ctx, victim.BMC.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("%s's BMC: %q %v, want off", victim.Name, p, err)
	}
	if _, err := env.WaitReleased(ctx, victim); err != nil {
		t.Fatal(err)
	}

	// NHC gives up on the healthy node's remediation (escalating): nodefence says TimedOut.
	u, err = rems.Get(ctx, healthy.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetAnnotations(map[string]string{kube.AnnotationTimedOut: time.Now().UTC().Format(time.RFC3339)})
	if _, err := rems.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		u, err := rems.Get(ctx, healthy.Name, metav1.GetOptions{})
		if err == nil {
			if c := condition(u, kube.ConditionSucceeded); c != nil && c.Reason == kube.ReasonTimedOut && processing(u) == metav1.ConditionFalse {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TimedOut on %s: %v %v", healthy.Name, u, err)
		}
	}

	// nodefence never deletes a remediation; NHC's delete is final.
	for _, n := range []string{healthy.Name, victim.Name} {
		if err := rems.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s (still there until NHC deletes it): %v", n, err)
		}
	}
	time.Sleep(5 * time.Second) // two passes of the controller
	if l, err := rems.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Fatalf("remediations after NHC deleted them: %v %v", l, err)
	}
	if fs := env.Fences(ctx, healthy.Name); len(fs) != 0 {
		t.Fatalf("%s fenced: %v", healthy.Name, fs)
	}
}

// machineRemediation installs a minimal Machine CRD (Cluster API's group and kind), creates a
// Machine naming node in status.nodeRef and a remediation owned by it, as MachineHealthCheck does,
// and checks that nodefence resolved the node (a node it hears: WitnessesReport).
func machineRemediation(t *testing.T, ctx context.Context, env *Env, dyn dynamic.Interface, machine, node string) {
	t.Helper()
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "machines.cluster.x-k8s.io"},
		"spec": map[string]any{"group": "cluster.x-k8s.io", "scope": "Namespaced",
			"names": map[string]any{"kind": "Machine", "plural": "machines", "singular": "machine", "listKind": "MachineList"},
			"versions": []any{map[string]any{"name": "v1beta1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}},
	}}
	if _, err := dyn.Resource(crds).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	machines := schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "machines"}
	m := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
		"metadata": map[string]any{"name": machine, "namespace": remediationNS},
		"spec":     map[string]any{"clusterName": "c"},
		"status":   map[string]any{"nodeRef": map[string]any{"kind": "Node", "name": node}},
	}}
	var created *unstructured.Unstructured
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if created, err = dyn.Resource(machines).Namespace(remediationNS).Create(ctx, m, metav1.CreateOptions{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("create Machine: %v", err)
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nodefence.io/v1alpha1", "kind": kube.RemediationKind,
		"metadata": map[string]any{"name": machine, "namespace": remediationNS, "ownerReferences": []any{map[string]any{
			"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": machine, "uid": string(created.GetUID())}}},
		"spec": map[string]any{},
	}}
	rems := dyn.Resource(kube.RemediationResource).Namespace(remediationNS)
	if _, err := rems.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, ctx, rems, machine, kube.ConditionSucceeded, metav1.ConditionFalse)
	got, err := rems.Get(ctx, machine, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, _, _ := unstructured.NestedString(got.Object, "status", "node"); n != node || c.Reason != kube.ReasonWitnessesReport {
		t.Fatalf("Machine %s's remediation: node %q, %s (%s); want node %s, %s", machine, n, c.Reason, c.Message, node, kube.ReasonWitnessesReport)
	}
	if err := rems.Delete(ctx, machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCondition waits until the remediation's condition has status want, and returns it.
func waitCondition(t *testing.T, ctx context.Context, rems dynamic.ResourceInterface, name, typ string, want metav1.ConditionStatus) metav1.Condition {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		u, err := rems.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if c := condition(u, typ); c != nil && c.Status == want {
				return *c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("remediation %s: no %s=%s within 60 s: %v %v", name, typ, want, u, err)
		}
	}
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	var st struct {
		Conditions []metav1.Condition `json:"conditions"`
	}
	m, ok, _ := unstructured.NestedMap(u.Object, "status")
	if !ok || runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st) != nil {
		return nil
	}
	return meta.FindStatusCondition(st.Conditions, typ)
}

func processing(u *unstructured.Unstructured) metav1.ConditionStatus {
	if c := condition(u, kube.ConditionProcessing); c != nil {
		return c.Status
	}
	return ""
}

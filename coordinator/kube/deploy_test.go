package kube

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// TestDeployManifests applies every manifest of deploy/ and deploy/examples/ to the real
// apiserver with server-side dry-run (the CRD itself is applied for real by TestMain), so they
// are valid for this Kubernetes version, and checks every YAML file is listed in its
// kustomization.
func TestDeployManifests(t *testing.T) {
	ctx := testContext(t)
	a, err := kubetest.NewApplier(cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{deployDir, filepath.Join(deployDir, "examples")} {
		objs, files, err := kubetest.ReadKustomization(dir)
		if err != nil {
			t.Fatal(err)
		}
		all, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, f := range all {
			if filepath.Base(f) != "kustomization.yaml" && !slices.Contains(files, f) {
				t.Errorf("%s is not listed in %s/kustomization.yaml", f, dir)
			}
		}
		kinds := map[string]int{}
		for _, o := range objs {
			if _, err := a.Apply(ctx, o, true); err != nil {
				t.Errorf("%s: %v", dir, err)
			}
			kinds[o.GetKind()]++
		}
		t.Logf("%s: %d objects dry-run applied: %v", dir, len(objs), kinds)
	}
}

// TestSeedConfigMaps applies the seed's example ConfigMaps for real, reads them back as the
// coordinator (its Role allows ConfigMaps in its namespace) and checks they make the seed's plan.
func TestSeedConfigMaps(t *testing.T) {
	ctx := testContext(t)
	a, err := kubetest.NewApplier(cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(filepath.Join(deployDir, "examples", "fence-config-seed.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if _, err := a.Apply(ctx, o, false); err != nil {
			t.Fatal(err)
		}
	}
	cs := kubernetes.NewForConfigOrDie(coordCfg)
	list, err := cs.CoreV1().ConfigMaps("nodefence").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cms []fenceconfig.ConfigMap
	for _, item := range list.Items {
		if !strings.HasPrefix(item.Name, "fence-") {
			continue
		}
		cm := fenceconfig.ConfigMap{Kind: "ConfigMap", Data: item.Data, Source: "ConfigMap " + item.Name}
		cm.Metadata.Name, cm.Metadata.Namespace = item.Name, item.Namespace
		cms = append(cms, cm)
	}
	cfg, err := fenceconfig.FromConfigMaps(cms, nil)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for n, node := range cfg.Nodes {
		nodes = append(nodes, n)
		want := map[string][]string{"isolation": {"fc-off"}, "power_management": {"eaton-off", "eaton-on"}, "recovery": {"fc-on"}}
		if d := cmp.Diff(want, node.Steps); d != "" {
			t.Errorf("node %s steps (-want +got):\n%s", n, d)
		}
	}
	sort.Strings(nodes)
	if d := cmp.Diff([]string{"host0", "host1"}, nodes); d != "" {
		t.Errorf("nodes (-want +got):\n%s", d)
	}
	// The coordinator reads Secrets of its namespace, and nothing of other namespaces.
	if _, err := cs.CoreV1().Secrets("nodefence").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list secrets in nodefence as the coordinator: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Errorf("the coordinator can list Secrets in default; want forbidden")
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "not-allowed"}}, metav1.CreateOptions{}); err == nil {
		t.Errorf("the coordinator can create Nodes; want forbidden")
	}
}

// TestDryRunRejects proves the dry-run above validates: a manifest with an unknown field and one
// breaking the NodeFence schema are refused.
func TestDryRunRejects(t *testing.T) {
	ctx := testContext(t)
	a, err := kubetest.NewApplier(cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"unknown field": `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x","namespace":"nodefence"},
			"spec":{"replicas":1,"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},
			"spec":{"containers":[{"name":"c","image":"i","imagePullPolicyy":"Always"}]}}}}`,
		"bad enum": `{"apiVersion":"nodefence.io/v1alpha1","kind":"NodeFence","metadata":{"name":"x"},
			"spec":{"id":"x","node":"n","action":"explode"}}`,
	}
	for name, doc := range bad {
		var obj unstructured.Unstructured
		if err := obj.UnmarshalJSON([]byte(doc)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Apply(ctx, &obj, true); err == nil {
			t.Errorf("%s: dry-run accepted it", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestTestbedOverlay renders testbed/overlays/cluster (nodefence as pods on the testbed cluster,
// locally imported images) with kustomize and dry-run applies every object to the real apiserver.
func TestTestbedOverlay(t *testing.T) {
	// The kubectl make kube-assets builds (the cluster's version), else one on PATH.
	kubectl := ""
	if dir, err := kubetest.AssetsDir(); err == nil {
		if p := filepath.Join(dir, kubetest.KubectlBinary); fileExecutable(p) {
			kubectl = p
		}
	}
	if kubectl == "" {
		var err error
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skip("kubectl (for kustomize) is not built (make kube-assets) nor installed")
		}
	}
	out, err := exec.Command(kubectl, "kustomize", "../../testbed/overlays/cluster").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	path := filepath.Join(t.TempDir(), "overlay.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	a, err := kubetest.NewApplier(cluster.Config())
	if err != nil {
		t.Fatal(err)
	}
	workloads := 0
	for _, o := range objs {
		if _, err := a.Apply(ctx, o, true); err != nil {
			t.Errorf("%s/%s: %v", o.GetKind(), o.GetName(), err)
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			workloads++
			m := c.(map[string]any)
			if m["imagePullPolicy"] != "Never" {
				t.Errorf("%s/%s: imagePullPolicy %v, want Never (no registry)", o.GetKind(), o.GetName(), m["imagePullPolicy"])
			}
			if img, _ := m["image"].(string); !strings.HasSuffix(img, ":testbed") && img != "nodefence/etcd:v3.6.16" {
				t.Errorf("%s/%s: image %q is not the testbed build", o.GetKind(), o.GetName(), img)
			}
			if o.GetName() == "nodefence-coordinator" && !slices.Contains(toStrings(m["args"]), "--metrics-listen=0.0.0.0:9101") {
				t.Errorf("coordinator args %v: the metrics patch missed", m["args"])
			}
		}
	}
	if workloads < 6 {
		t.Fatalf("only %d containers rendered", workloads)
	}
	t.Logf("%d objects dry-run applied", len(objs))
}

func fileExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

func toStrings(v any) []string {
	var out []string
	s, _ := v.([]any)
	for _, x := range s {
		if str, ok := x.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// TestDriversSurviveOneEviction: every fence-driver Deployment of deploy/ runs at least two
// replicas and has a PodDisruptionBudget selecting exactly its pods that keeps one of them, so
// that no single eviction (a drain, or a node agent's) leaves the coordinator without a driver.
func TestDriversSurviveOneEviction(t *testing.T) {
	objs, _, err := kubetest.ReadKustomization(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	var pdbs []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "PodDisruptionBudget" {
			pdbs = append(pdbs, o)
		}
	}
	drivers := 0
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetLabels()["app.kubernetes.io/name"] != "nodefence-fence-driver" {
			continue
		}
		drivers++
		if n := number(o.Object, "spec", "replicas"); n < 2 {
			t.Errorf("%s: %d replicas, want at least 2", o.GetName(), n)
		}
		podLabels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		var covering []string
		for _, p := range pdbs {
			sel, _, _ := unstructured.NestedStringMap(p.Object, "spec", "selector", "matchLabels")
			if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(podLabels)) {
				covering = append(covering, p.GetName())
				if mu := number(p.Object, "spec", "maxUnavailable"); mu != 1 {
					t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, want 1", p.GetName(), mu)
				}
			}
		}
		if len(covering) != 1 {
			t.Errorf("%s: covered by PodDisruptionBudgets %v, want exactly one (the Eviction API refuses a pod with two)", o.GetName(), covering)
		}
	}
	if drivers < 3 {
		t.Errorf("%d fence-driver Deployments in deploy/, want the three (ipmi, pdu, brocade)", drivers)
	}
}

// number reads a whole number at path, whichever numeric type the manifest decoder gave it (-1 if
// none).
func number(obj map[string]any, path ...string) int64 {
	v, _, _ := unstructured.NestedFieldNoCopy(obj, path...)
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case float64:
		return int64(n)
	}
	return -1
}

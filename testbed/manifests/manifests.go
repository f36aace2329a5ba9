// Package manifests reads the workloads in deploy/ for tests that check their containers' flags
// against the binaries, so that a renamed flag or a refused value fails a test instead of a
// cluster's rollout.
package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Args returns the args of every container named container in the Deployments, StatefulSets and DaemonSets of
// the multi-document YAML file, one slice per workload. It fails the test when there is none.
func Args(t testing.TB, file, container string) [][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, doc := range strings.Split(string(b), "\n---") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var spec *corev1.PodSpec
		switch tm.Kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			spec = &d.Spec.Template.Spec
		case "StatefulSet":
			var d appsv1.StatefulSet
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			spec = &d.Spec.Template.Spec
		case "DaemonSet":
			var d appsv1.DaemonSet
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			spec = &d.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range spec.Containers {
			if c.Name == container {
				out = append(out, c.Args)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no Deployment, StatefulSet or DaemonSet has a container %q", file, container)
	}
	return out
}

// Localize rewrites a container's args for this machine: every $(VAR) in vars is replaced, and
// every flag value under one of the mount points (such as "/etc/nodefence/") moves below a
// temporary root, where each of files (absolute paths as the manifest mounts them) is created.
func Localize(t testing.TB, args []string, vars map[string]string, mounts []string, files ...string) []string {
	t.Helper()
	root := t.TempDir()
	var pairs []string
	for k, v := range vars {
		pairs = append(pairs, "$("+k+")", v)
	}
	for _, m := range mounts {
		pairs = append(pairs, "="+m, "="+root+m)
	}
	r := strings.NewReplacer(pairs...)
	for _, f := range files {
		path := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		// Content fit for every file the binaries only check for: a boot id reads as one.
		if err := os.WriteFile(path, []byte("6f0c1c1e-5c3a-4d2b-9a57-3f1e2d4c5b6a\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = r.Replace(a)
	}
	return out
}

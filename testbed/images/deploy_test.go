package images

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

const deployDir = "../../deploy"

// podSpecs returns the pod template of every workload of deploy/, by "Kind/name".
func podSpecs(t *testing.T) map[string]corev1.PodSpec {
	t.Helper()
	objs, _, err := kubetest.ReadKustomization(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.PodSpec{}
	for _, o := range objs {
		var spec corev1.PodSpec
		switch o.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			convert(t, o, &d)
			spec = d.Spec.Template.Spec
		case "DaemonSet":
			var d appsv1.DaemonSet
			convert(t, o, &d)
			spec = d.Spec.Template.Spec
		case "StatefulSet":
			var d appsv1.StatefulSet
			convert(t, o, &d)
			spec = d.Spec.Template.Spec
		default:
			continue
		}
		out[o.GetKind()+"/"+o.GetName()] = spec
	}
	return out
}

func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatalf("%s/%s: %v", o.GetKind(), o.GetName(), err)
	}
}

// TestManifestsNameBuiltImages: every image deploy/ runs is one `make images` builds, named
// without a registry, and each container runs the binary its image carries.
func TestManifestsNameBuiltImages(t *testing.T) {
	built := map[string]bool{"nodefence/etcd:" + EtcdVersion: true}
	for _, b := range Binaries {
		built["nodefence/"+b] = true
	}
	for w, spec := range podSpecs(t) {
		for _, c := range spec.Containers {
			repo, tag, _ := strings.Cut(c.Image, ":")
			if !built[repo] && !built[c.Image] {
				t.Errorf("%s container %s: image %q is not one make images builds", w, c.Name, c.Image)
			}
			if tag == "" {
				t.Errorf("%s container %s: image %q has no tag", w, c.Name, c.Image)
			}
			if bin := strings.TrimPrefix(repo, "nodefence/"); len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/"+bin {
				t.Errorf("%s container %s: command %q, want the image's /usr/local/bin/%s", w, c.Name, c.Command, bin)
			}
		}
	}
}

// TestDeployCertificatePaths: every Secret a workload mounts is in the templates of
// deploy/examples/secrets-template.yaml, and every TLS one (*-tls) is also issued by cert-manager
// (deploy/cert-manager): both certificate paths are complete.
func TestDeployCertificatePaths(t *testing.T) {
	fromCertManager := map[string]bool{}
	cm, _, err := kubetest.ReadKustomization(filepath.Join(deployDir, "cert-manager"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range cm {
		if o.GetKind() == "Certificate" {
			name, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
			fromCertManager[name] = true
			uris, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "uris")
			for _, u := range uris {
				if _, err := identity.Parse(u); err != nil {
					t.Errorf("Certificate %s: URI SAN %q: %v", o.GetName(), u, err)
				}
			}
		}
	}
	fromTemplate := map[string]bool{}
	tmpl, err := kubetest.ReadObjects(filepath.Join(deployDir, "examples", "secrets-template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range tmpl {
		if o.GetKind() == "Secret" {
			fromTemplate[o.GetName()] = true
		}
	}
	for w, spec := range podSpecs(t) {
		for _, v := range spec.Volumes {
			if v.Secret == nil {
				continue
			}
			n := v.Secret.SecretName
			if !fromTemplate[n] {
				t.Errorf("%s mounts Secret %s, which secrets-template.yaml does not provide", w, n)
			}
			if strings.HasSuffix(n, "-tls") && !fromCertManager[n] {
				t.Errorf("%s mounts Secret %s, which no cert-manager Certificate issues", w, n)
			}
		}
	}
}

// TestDriversAreNotNodeBound: a fence driver must be able to leave a dead node at once, so no
// driver keeps state on a PersistentVolumeClaim or the node's disk.
func TestDriversAreNotNodeBound(t *testing.T) {
	n := 0
	for w, spec := range podSpecs(t) {
		if !strings.Contains(w, "fence-driver") {
			continue
		}
		n++
		for _, v := range spec.Volumes {
			if v.PersistentVolumeClaim != nil || v.HostPath != nil {
				t.Errorf("%s: volume %s binds the driver to a node", w, v.Name)
			}
		}
		var tolerates []string
		for _, tol := range spec.Tolerations {
			if tol.TolerationSeconds != nil && *tol.TolerationSeconds <= 60 {
				tolerates = append(tolerates, tol.Key)
			}
		}
		for _, k := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
			if !slices.Contains(tolerates, k) {
				t.Errorf("%s: does not leave a node with %s within 60 s", w, k)
			}
		}
	}
	if n == 0 {
		t.Fatal("no fence-driver workloads in deploy/")
	}
}

// TestNonRootReadsItsSecrets: a container that runs as a non-root user can read every Secret file
// it mounts. Secret files belong to root, so a mode without "other" read needs the pod's fsGroup
// and group read; the coordinator once refused to start with its etcd password 0400 and no fsGroup.
func TestNonRootReadsItsSecrets(t *testing.T) {
	for w, spec := range podSpecs(t) {
		sc := spec.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			continue
		}
		for _, c := range spec.Containers {
			if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil && *c.SecurityContext.RunAsUser == 0 {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Secret == nil {
					continue
				}
				mode := int32(0o644)
				if v.Secret.DefaultMode != nil {
					mode = *v.Secret.DefaultMode
				}
				switch {
				case mode&0o004 != 0:
				case sc.FSGroup == nil:
					t.Errorf("%s: Secret volume %s (mode %#o) is unreadable to user %d: no fsGroup", w, v.Name, mode, *sc.RunAsUser)
				case mode&0o040 == 0:
					t.Errorf("%s: Secret volume %s (mode %#o) is unreadable to fsGroup %d", w, v.Name, mode, *sc.FSGroup)
				}
			}
		}
	}
}

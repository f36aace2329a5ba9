// Package kubetest runs a real kube-apiserver and etcd for integration tests.
//
// The binaries are built from Go modules (k8s.io/kubernetes and go.etcd.io/etcd/server/v3) in two
// small tool modules under testbed/kube/tools, each with its own go.mod, so the project's go.mod
// never carries the Kubernetes dependency graph. They are built once into a cache directory keyed
// by their versions (see AssetsDir) by
//
//	go run ./testbed/kube/cmd/kube-assets
//
// which `make test` runs first. A test that needs a cluster and finds no binaries fails with a
// message naming that command: it never skips.
//
// A bare apiserver has no controller manager and no kubelet: namespaces never finish deleting,
// nothing is garbage collected, graceful pod deletes stay Terminating. Tests use unique names.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nodefence/nodefence/testbed/gomod"
)

// Versions of the binaries. The tool modules' go.mod files must require exactly these; Build
// checks it, so the cache key never lies about what is inside.
const (
	KubeVersion = "v1.36.3"
	EtcdVersion = "v3.6.16"
)

// BuildCommand is the command that builds the binaries when they are missing.
const BuildCommand = "go run ./testbed/kube/cmd/kube-assets"

// AssetsEnv overrides the cache directory of the binaries.
const AssetsEnv = "NODEFENCE_KUBE_ASSETS"

// Binary names inside AssetsDir.
const (
	APIServerBinary         = "kube-apiserver"
	EtcdBinary              = "etcd"
	KubeletBinary           = "kubelet"
	ControllerManagerBinary = "kube-controller-manager"
	SchedulerBinary         = "kube-scheduler"
	// KubectlBinary is the client the install test applies deploy/'s overlay with.
	KubectlBinary = "kubectl"
)

// AssetsDir is where the binaries live: $NODEFENCE_KUBE_ASSETS if set, else
// <user cache dir>/nodefence/kube-<KubeVersion>-etcd-<EtcdVersion> (by default
// $HOME/.cache/nodefence/kube-v1.36.3-etcd-v3.6.16).
func AssetsDir() (string, error) {
	if d := os.Getenv(AssetsEnv); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the kube test binaries (set %s): %w", AssetsEnv, err)
	}
	return filepath.Join(base, "nodefence", "kube-"+KubeVersion+"-etcd-"+EtcdVersion), nil
}

// ErrNoBinaries reports missing test binaries; its message names BuildCommand.
var ErrNoBinaries = errors.New("kube test binaries missing")

// Binaries returns the paths of the apiserver and etcd binaries, or an error wrapping
// ErrNoBinaries that tells how to build them.
func Binaries() (apiserver, etcd string, err error) {
	dir, err := AssetsDir()
	if err != nil {
		return "", "", err
	}
	apiserver, etcd = filepath.Join(dir, APIServerBinary), filepath.Join(dir, EtcdBinary)
	for _, p := range []string{apiserver, etcd} {
		if st, serr := os.Stat(p); serr != nil || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%w: %s not found; build them with `%s` from the repository root (or `make test`); about 7 minutes cold",
				ErrNoBinaries, p, BuildCommand)
		}
	}
	return apiserver, etcd, nil
}

// tool is one binary built from a main package (pkg, relative to dir) of a tool module.
type tool struct {
	dir, pkg, module, version, binary string
	ldflags                           string
}

// tools lists the binaries in build order: the apiserver first (the integration tests need only it
// and etcd), then the cluster's node and controller binaries, which reuse most of its compiled
// packages from the Go build cache.
func tools(root string) []tool {
	kubeLD := "-s -w -X k8s.io/component-base/version.gitVersion=" + KubeVersion +
		" -X k8s.io/component-base/version.gitMajor=" + major(KubeVersion) +
		" -X k8s.io/component-base/version.gitMinor=" + minor(KubeVersion)
	kube := func(binary string) tool {
		return tool{dir: filepath.Join(root, "kube"), pkg: "./cmd/" + binary, module: "k8s.io/kubernetes",
			version: KubeVersion, binary: binary, ldflags: kubeLD}
	}
	return []tool{
		{dir: filepath.Join(root, "etcd"), pkg: ".", module: "go.etcd.io/etcd/server/v3", version: EtcdVersion,
			binary: EtcdBinary, ldflags: "-s -w"},
		kube(APIServerBinary),
		kube(SchedulerBinary),
		kube(ControllerManagerBinary),
		kube(KubeletBinary),
		kube(KubectlBinary),
	}
}

func major(v string) string { return strings.Split(strings.TrimPrefix(v, "v"), ".")[0] }
func minor(v string) string { return strings.Split(strings.TrimPrefix(v, "v"), ".")[1] }

// Build builds every missing binary into AssetsDir from the tool modules in toolsRoot
// (testbed/kube/tools). Present binaries are kept, so Build is cheap when nothing is missing.
// Each binary is written under a temporary name and renamed, so an interrupted build never leaves
// a half-written binary behind. Progress goes to log.
func Build(ctx context.Context, toolsRoot string, log io.Writer) (string, error) {
	dir, err := AssetsDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, t := range tools(toolsRoot) {
		if err := gomod.Requires(filepath.Join(t.dir, "go.mod"), t.module, t.version); err != nil {
			return "", err
		}
		out := filepath.Join(dir, t.binary)
		if st, err := os.Stat(out); err == nil && st.Mode()&0o111 != 0 {
			fmt.Fprintf(log, "%s %s: present in %s\n", t.binary, t.version, dir)
			continue
		}
		fmt.Fprintf(log, "%s %s: building into %s (6-15 minutes cold each for kube-apiserver, kube-controller-manager and kubelet) ...\n", t.binary, t.version, dir)
		tmp := fmt.Sprintf("%s.tmp.%d", out, os.Getpid())
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", t.ldflags, "-o", tmp, t.pkg)
		cmd.Dir = t.dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("building %s in %s: %w", t.binary, t.dir, err)
		}
		if err := os.Rename(tmp, out); err != nil {
			return "", err
		}
		fmt.Fprintf(log, "%s %s: built\n", t.binary, t.version)
	}
	return dir, nil
}

package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/procs"
)

// TestContainerdImportsAndRuns hands an image tarball to a real containerd (a private instance:
// its own root, state and socket) with `ctr images import`, as deploy/README.md tells operators
// to, checks the name survives, and runs the image with runc: its program runs as the image's
// non-root user.
func TestContainerdImportsAndRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root")
	}
	for _, b := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed", b)
		}
	}
	dir, err := os.MkdirTemp("", "nfimg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	// A static program that prints who it runs as.
	src := filepath.Join(dir, "src")
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(src, "go.mod"), "module whoami\n\ngo 1.22\n")
	write(filepath.Join(src, "main.go"), "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Printf(\"uid=%d gid=%d\\n\", os.Getuid(), os.Getgid()) }\n")
	bin := filepath.Join(dir, "whoami")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	img, err := Build(Spec{Name: "nodefence/whoami", Version: "test", Entrypoint: []string{"/usr/local/bin/whoami"},
		User: "65532:65532", Layers: []Layer{BaseLayer(), BinaryLayer("whoami", bin)}, Created: fixed})
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, "whoami.oci.tar")
	if err := WriteOCI(img, "nodefence/whoami:test", tarball, fixed); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(dir, "c.sock")
	write(filepath.Join(dir, "config.toml"), `version = 2
root = "`+filepath.Join(dir, "root")+`"
state = "`+filepath.Join(dir, "state")+`"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "`+sock+`"
[ttrpc]
  address = "`+sock+`.ttrpc"
`)
	p, err := procs.Start("containerd", filepath.Join(dir, "containerd.log"), "containerd", "--config", filepath.Join(dir, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("containerd log:\n%s", lastLines(string(b), 20))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctr := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", "nodefence-test"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for ctx.Err() == nil {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctr("images", "import", tarball)
	// Under the name the kubelet asks containerd's CRI for.
	if refs := ctr("images", "ls", "-q"); !slices.Contains(strings.Fields(refs), "docker.io/nodefence/whoami:test") {
		t.Fatalf("imported images %q do not include docker.io/nodefence/whoami:test", refs)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if ls := ctr("images", "ls"); !strings.Contains(ls, d.String()) {
		t.Fatalf("containerd holds another digest than built (%s):\n%s", d, ls)
	}
	if out := ctr("run", "--rm", "docker.io/nodefence/whoami:test", "nodefence-whoami"); strings.TrimSpace(out) != "uid=65532 gid=65532" {
		t.Fatalf("container printed %q, want uid=65532 gid=65532", out)
	}
}

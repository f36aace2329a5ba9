// Package containerdtest runs a real containerd (the Debian package's binary) for tests: its own
// root, state, socket and config in a temporary directory, so that it never touches the host's
// runtime. It needs root (containerd mounts snapshots) and fails the test, never pretends, when it
// cannot start.
package containerdtest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/syncbuf"
)

// Containerd is a running containerd.
type Containerd struct {
	// Socket is the path of its gRPC (and CRI) socket.
	Socket string
	// Root is its --root: images and snapshots live below it.
	Root string
	dir  string
	log  syncbuf.Buffer
	stop func()
	once sync.Once
}

// Endpoint is the CRI endpoint ("unix://" + Socket).
func (c *Containerd) Endpoint() string { return "unix://" + c.Socket }

// Start starts containerd for the test and stops it at the end of the test.
func Start(t *testing.T) *Containerd {
	t.Helper()
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("containerd log:\n%s", c.Log())
		}
	})
	return c
}

// New starts containerd with its files in a new temporary directory and returns once it answers.
// The caller must call Stop.
func New() (*Containerd, error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("containerd is not installed (make deps installs the Debian package): %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("containerd needs root")
	}
	// A short directory: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "nf-ctd-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{Socket: filepath.Join(dir, "c.sock"), Root: filepath.Join(dir, "root"), dir: dir}
	cfg := config(c, dir)
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfgPath, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = &c.log, &c.log
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c.stop = func() {
		_ = cmd.Process.Kill()
		<-exited
		// Snapshots are mounted below root while containers run; none should be left, but be sure.
		_ = exec.Command("umount", "-R", c.Root).Run()
		_ = os.RemoveAll(dir)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(c.Socket); err == nil && c.ctr(context.Background(), "version") == nil {
			return c, nil
		}
		select {
		case err := <-exited:
			exited <- err
			c.Stop()
			return nil, fmt.Errorf("containerd exited: %v\n%s", err, c.Log())
		default:
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("containerd not ready after 20s:\n%s", c.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// config is containerd's configuration for c, everything below dir.
func config(c *Containerd, dir string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "nodefence.test/pause:none"
  disable_apparmor = true
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q
`, c.Root, filepath.Join(dir, "state"), c.Socket, c.Socket+".ttrpc", filepath.Join(dir, "opt"),
		filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf"), filepath.Join(dir, "runc"))
}

// Stop kills containerd (by its process id) and removes its files. It is safe to call more than
// once.
func (c *Containerd) Stop() {
	c.once.Do(c.stop)
}

// Log is what containerd wrote so far.
func (c *Containerd) Log() string { return c.log.String() }

func (c *Containerd) ctr(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.Socket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// ImportImage builds a one-layer OCI image named ref whose layer holds a file of size bytes, and
// imports it into the CRI's namespace (k8s.io) with ctr.
func (c *Containerd) ImportImage(t *testing.T, ref string, size int) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "data", Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bytes.Repeat([]byte{'x'}, size)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	c.importLayer(t, ref, layer.Bytes(), []string{"/data"})
}

// ImportBusybox imports an image named ref made of this machine's static busybox (Debian package
// busybox-static) as /bin/busybox and /bin/sh, with an empty /tmp, running entrypoint. Its
// processes can write into their writable layer (anywhere but the layer's own files).
func (c *Containerd) ImportBusybox(t *testing.T, ref string, entrypoint ...string) {
	t.Helper()
	bin, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox (Debian package busybox-static): %v", err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, h := range []*tar.Header{
		{Name: "bin/", Mode: 0o755, Typeflag: tar.TypeDir},
		{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg},
		{Name: "bin/sh", Linkname: "/bin/busybox", Mode: 0o777, Typeflag: tar.TypeSymlink},
		{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	c.importLayer(t, ref, layer.Bytes(), entrypoint)
}

// importLayer imports a one-layer image named ref running cmd.
func (c *Containerd) importLayer(t *testing.T, ref string, layer []byte, cmd []string) {
	t.Helper()
	blobs := map[string][]byte{}
	add := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return d, len(b)
	}
	layerDigest, layerSize := add(layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Cmd": cmd, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	configDigest, configSize := add(config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	manifestDigest, manifestSize := add(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifestDigest, "size": manifestSize,
			"annotations": map[string]string{"org.opencontainers.image.ref.name": ref}}},
	})
	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	write := func(name string, b []byte) {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := aw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	write("index.json", index)
	for d, b := range blobs {
		write("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b)
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.dir, "image.tar")
	defer os.Remove(path)
	if err := os.WriteFile(path, archive.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Setup, not what a test checks: an import that lost its own just-written content to the
	// content store's garbage collection ("content digest ...: not found" while unpacking, seen
	// once in a full CI run) is tried again, twice at most.
	var err error
	for try := 0; try < 3; try++ {
		if err = c.ctr(ctx, "images", "import", "--base-name", strings.Split(ref, ":")[0], "--index-name", ref, path); err == nil ||
			!strings.Contains(err.Error(), "not found") {
			break
		}
		t.Logf("importing %s again: %v", ref, err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

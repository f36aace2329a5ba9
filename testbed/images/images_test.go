package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

var fixed = time.Unix(1700000000, 0).UTC()

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// TestReproducible: the same inputs give the same image digest and the same tarball, byte for
// byte, whatever the files' times on disk; a different fixed time gives a different image.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "coordinator")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := func(created time.Time) Spec {
		return Spec{Name: "nodefence/coordinator", Version: "test", Entrypoint: []string{"/usr/local/bin/coordinator"},
			User: "65532:65532", Layers: []Layer{BaseLayer(), BinaryLayer("coordinator", bin)}, Created: created}
	}
	var digests []v1.Hash
	var sums []string
	for i := range 2 {
		// Touch the input between builds: file times must not leak into the image.
		if err := os.Chtimes(bin, time.Now().Add(time.Duration(i)*time.Hour), time.Now().Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
		img, err := Build(spec(fixed))
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, digest(t, img))
		out := filepath.Join(dir, fmt.Sprintf("img%d.oci.tar", i))
		if err := WriteOCI(img, "nodefence/coordinator:test", out, fixed); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, fileSum(t, out))
	}
	if digests[0] != digests[1] || sums[0] != sums[1] {
		t.Fatalf("two builds differ: digests %v, tarballs %v", digests, sums)
	}
	other, err := Build(spec(fixed.Add(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, other) == digests[0] {
		t.Fatal("a different creation time gave the same digest: the time is not in the image")
	}
	img, err := Build(spec(fixed))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || !cf.Created.Time.Equal(fixed) || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config: user %q created %v os %s arch %s", cf.Config.User, cf.Created, cf.OS, cf.Architecture)
	}
}

// TestOCILayoutReadsBack: the tarball is an OCI image layout whose index names the image, and the
// image read back from it has the digest that was built.
func TestOCILayoutReadsBack(t *testing.T) {
	dir := t.TempDir()
	img, err := Build(Spec{Name: "nodefence/fencectl", Version: "v1", Layers: []Layer{BaseLayer()}, Created: fixed})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "x.oci.tar")
	if err := WriteOCI(img, "nodefence/fencectl:v1", file, fixed); err != nil {
		t.Fatal(err)
	}
	unpacked := filepath.Join(dir, "layout")
	untar(t, file, unpacked)
	p, err := layout.FromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "nodefence/fencectl:v1" ||
		m.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/nodefence/fencectl:v1" {
		t.Fatalf("index: %+v", m.Manifests)
	}
	if m.Manifests[0].Digest != digest(t, img) {
		t.Fatalf("index names %s, built %s", m.Manifests[0].Digest, digest(t, img))
	}
}

// TestFenceDriverImageRunsAgents builds the fence-driver image's agent layer from this machine's
// Debian packages twice (same bytes), unpacks the image and runs real ClusterLabs agents in it,
// as the image's non-root user, with nothing from the host: their metadata comes back.
func TestFenceDriverImageRunsAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("packs the fence agents and their Python")
	}
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	bin := filepath.Join(t.TempDir(), "fence-driver")
	if err := os.WriteFile(bin, []byte("not run here"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The layer's tar twice (compression is deterministic, TestReproducible checks it on a small
	// image; compressing this one twice would double the test's time under -race).
	var sums [2][32]byte
	var layer Layer
	for i := range 2 {
		l, pkgs, err := AgentLayer()
		if err != nil {
			t.Fatal(err)
		}
		if len(pkgs) < 10 {
			t.Fatalf("only %d packages in the fence agents' closure", len(pkgs))
		}
		b, err := tarLayer(l.Entries, fixed)
		if err != nil {
			t.Fatal(err)
		}
		sums[i], layer = sha256.Sum256(b), l
	}
	if sums[0] != sums[1] {
		t.Fatalf("the fence agents' layer built twice differs: %x and %x", sums[0], sums[1])
	}
	img, err := Build(Spec{Name: "nodefence/fence-driver", Version: "test", User: "65532:65532",
		Layers: []Layer{BaseLayer(), layer, BinaryLayer("fence-driver", bin)}, Created: fixed, GzipLevel: gzip.BestSpeed})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	rc := mutate.Extract(img)
	defer rc.Close()
	extract(t, rc, root)
	for _, excluded := range []string{"/usr/lib/python3/dist-packages/botocore", "/usr/bin/dpkg"} {
		if _, err := os.Lstat(filepath.Join(root, excluded)); err == nil {
			t.Errorf("%s is in the image, though excluded", excluded)
		}
	}
	for _, agent := range []string{"fence_ipmilan", "fence_apc_snmp", "fence_brocade", "fence_redfish"} {
		cmd := exec.Command("chroot", "--userspec=65532:65532", root, "/usr/sbin/"+agent, "-o", "metadata")
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte(`<resource-agent name="`+agent+`"`)) {
			t.Errorf("%s -o metadata in the image: %v\n%s", agent, err, lastLines(string(out), 15))
		}
	}
	// The programs the agents run are there too.
	for _, prog := range []string{"/usr/bin/ipmitool", "/usr/bin/snmpget", "/usr/bin/ssh", "/usr/bin/telnet"} {
		if fi, err := os.Stat(filepath.Join(root, prog)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s missing or not executable in the image: %v", prog, err)
		}
	}
}

func extract(t *testing.T, r io.Reader, root string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		if !strings.HasPrefix(p, root) {
			t.Fatalf("entry %q escapes the root", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode)&0o7777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, os.FileMode(h.Mode)&0o777|modeBits(h.Mode))
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.Symlink(h.Linkname, p); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if h.Typeflag != tar.TypeSymlink {
			os.Lchown(p, h.Uid, h.Gid)
		}
	}
}

func modeBits(m int64) os.FileMode {
	var out os.FileMode
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	extract(t, f, dir)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestQualifiedRef: the name containerd stores is the one the kubelet's CRI request normalizes to.
func TestQualifiedRef(t *testing.T) {
	for ref, want := range map[string]string{
		"nodefence/coordinator:v1":          "docker.io/nodefence/coordinator:v1",
		"busybox:1":                         "docker.io/library/busybox:1",
		"registry.example:5000/nf/agent:v2": "registry.example:5000/nf/agent:v2",
		"localhost/nf:v1":                   "localhost/nf:v1",
		"mirror.example/nf/driver:v3":       "mirror.example/nf/driver:v3",
	} {
		if got := QualifiedRef(ref); got != want {
			t.Errorf("QualifiedRef(%q) = %q, want %q", ref, got, want)
		}
	}
}

package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

func TestParseMountinfo(t *testing.T) {
	data := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 22 0:40 / /tmp/c/nodes/node-1/kubelet/pods/x/volumes/a\040b rw shared:1 - tmpfs tmpfs rw
51 22 0:41 / /tmp/c/nodes/node-1/containerd/state/run/rootfs rw - overlay overlay rw
52 22 0:42 / /tmp/c rw - tmpfs tmpfs rw
53 22 0:43 / /tmp/cx rw - tmpfs tmpfs rw
garbage line
`
	ms := parseMountinfo(data)
	if len(ms) != 7 {
		t.Fatalf("%d mounts, want 7: %v", len(ms), ms)
	}
	if got := cgroupV1Hierarchies(ms); !slices.Equal(got, []string{"/sys/fs/cgroup/pids"}) {
		t.Errorf("v1 hierarchies %v", got)
	}
	if got := cgroupMounts(ms, true); !slices.Equal(got, []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"}) {
		t.Errorf("all hierarchies %v", got)
	}
	want := []string{
		"/tmp/c/nodes/node-1/kubelet/pods/x/volumes/a b",
		"/tmp/c/nodes/node-1/containerd/state/run/rootfs",
		"/tmp/c",
	}
	if got := mountsUnder(ms, "/tmp/c/"); !slices.Equal(got, want) {
		t.Errorf("mountsUnder = %q, want %q", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"defaults", Config{Dir: "/tmp/x"}, nil},
		{"relative dir", Config{Dir: "x"}, []string{"Dir: must be an absolute path"}},
		{"too many nodes", Config{Dir: "/x", Nodes: 10}, []string{"Nodes: must be 1 to 9"}},
		{"bad prefix and zone", Config{Dir: "/x", Prefix: "NF-1", Zones: []string{""}}, []string{"Prefix:", "Zones[0]: empty"}},
		{"negative", Config{Dir: "/x", NodeMonitorGracePeriod: -1}, []string{"must not be negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SetDefaults()
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLayoutAddresses(t *testing.T) {
	l := newLayout(Config{Prefix: "nf"})
	if l.Bridge != "nfbr0" || l.APIServerIP.String() != "10.203.0.1" || l.ServiceIP.String() != "10.203.0.2" {
		t.Fatalf("layout %+v", l)
	}
	ip, pods := nodeAddrs(l, 2)
	if ip.String() != "10.203.0.12" || pods.String() != "10.204.2.0/24" {
		t.Fatalf("node 2: %s %s", ip, pods)
	}
}

func TestNodeConfigs(t *testing.T) {
	n := &Node{Name: "node-1", Dir: "/d/nodes/node-1", CgroupRoot: "/nf-node-1"}
	n.IP, n.PodCIDR = nodeAddrs(newLayout(Config{Prefix: "nf"}), 1)
	for name, text := range map[string]string{
		"containerd": containerdConfig(n), "cni": cniConfig(n), "kubelet": kubeletConfig(n, "/d/pki/ca.crt", 0),
		"kubelet-allocatable": kubeletConfig(n, "/d/pki/ca.crt", 3<<30),
	} {
		for _, want := range map[string][]string{
			"containerd":          {`restrict_oom_score_adj = true`, `Root = "/d/nodes/node-1/containerd/runc"`, `stream_server_address = "10.203.0.11"`, `sandbox_image = "` + PauseImage},
			"cni":                 {`"subnet": "10.204.1.0/24"`, `"dataDir": "/d/nodes/node-1/ipam"`},
			"kubelet":             {"cgroupRoot: /nf-node-1", "address: 10.203.0.11", "unix:///d/nodes/node-1/containerd.sock", "podLogsDir: /d/nodes/node-1/pod-logs", "enforceNodeAllocatable: []"},
			"kubelet-allocatable": {"enforceNodeAllocatable: [pods]", `systemReserved: {memory: "3221225472"}`},
		}[name] {
			if !strings.Contains(text, want) {
				t.Errorf("%s config lacks %q:\n%s", name, want, text)
			}
		}
	}
	var v any
	if err := json.Unmarshal([]byte(cniConfig(n)), &v); err != nil {
		t.Errorf("CNI config is not JSON: %v", err)
	}
}

// TestDockerArchive checks the archive `ctr images import` reads: the manifest names the
// configuration by its digest, and the configuration names the layer by its digest.
func TestDockerArchive(t *testing.T) {
	data, err := dockerArchive("example.com/x:1", []file{
		{Name: "bin", Dir: true, Mode: 0o755}, {Name: "bin/sh", Mode: 0o755, Data: []byte("#!")}, {Name: "bin/ls", Link: "/bin/sh", Mode: 0o777},
	}, imageConfig{Entrypoint: []string{"/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	entries := readTar(t, data)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest %s: %v", entries["manifest.json"], err)
	}
	m := manifest[0]
	if !slices.Equal(m.RepoTags, []string{"example.com/x:1"}) || len(m.Layers) != 1 {
		t.Fatalf("manifest %+v", m)
	}
	conf := entries[m.Config]
	if sum := sha256.Sum256(conf); hex.EncodeToString(sum[:])+".json" != m.Config {
		t.Errorf("config %s is not named by its digest", m.Config)
	}
	layer := entries[m.Layers[0]]
	sum := sha256.Sum256(layer)
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
		Config struct{ Entrypoint []string }
	}
	if err := json.Unmarshal(conf, &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.RootFS.DiffIDs, []string{"sha256:" + hex.EncodeToString(sum[:])}) {
		t.Errorf("diff_ids %v, layer digest %x", cfg.RootFS.DiffIDs, sum)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/bin/sh"}) {
		t.Errorf("entrypoint %v", cfg.Config.Entrypoint)
	}
	files := readTar(t, layer)
	if string(files["bin/sh"]) != "#!" {
		t.Errorf("layer files %v", files)
	}
	again, _ := dockerArchive("example.com/x:1", []file{
		{Name: "bin/ls", Link: "/bin/sh", Mode: 0o777}, {Name: "bin/sh", Mode: 0o755, Data: []byte("#!")}, {Name: "bin", Dir: true, Mode: 0o755},
	}, imageConfig{Entrypoint: []string{"/bin/sh"}})
	if !bytes.Equal(data, again) {
		t.Error("the archive depends on the order of the files")
	}
}

func readTar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = b
	}
}

// TestBuildImages builds the real images: pause compiled with gcc, busybox from Debian's static
// binary. The pause binary must wait until SIGTERM and then exit 0.
func TestBuildImages(t *testing.T) {
	dir := t.TempDir()
	pause, busybox, err := buildImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{pause: "pause", busybox: "bin/busybox"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m []struct{ Layers []string }
		entries := readTar(t, data)
		if err := json.Unmarshal(entries["manifest.json"], &m); err != nil || len(m) != 1 {
			t.Fatalf("%s: manifest: %v", path, err)
		}
		if _, ok := readTar(t, entries[m[0].Layers[0]])[want]; !ok {
			t.Errorf("%s: layer lacks %s", path, want)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "pause"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("pause exited on its own: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("pause after SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("pause ignored SIGTERM")
	}
}

// TestUpMissingBinaries: without the Kubernetes binaries Up fails at once, naming every missing
// binary and the command that builds them; it touches nothing on the machine.
func TestUpMissingBinaries(t *testing.T) {
	t.Setenv(kubetest.AssetsEnv, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Up(ctx, Config{Dir: t.TempDir()}, nil)
	if !errors.Is(err, kubetest.ErrNoBinaries) {
		t.Fatalf("Up = %v, want ErrNoBinaries", err)
	}
	for _, want := range []string{kubeletBin, apiBin, kcmBin, schedulerBin, etcdBin, kubetest.BuildCommand} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestWithFields(t *testing.T) {
	doc := "kind: KubeletConfiguration\nevictionHard: {}\nauthentication:\n  evictionHard: nested\n"
	got := withFields(doc, map[string]string{"evictionHard": `{memory.available: "400Mi"}`, "systemReserved": `{memory: "1"}`})
	want := "kind: KubeletConfiguration\nevictionHard: {memory.available: \"400Mi\"}\nauthentication:\n  evictionHard: nested\nsystemReserved: {memory: \"1\"}\n"
	if got != want {
		t.Errorf("withFields:\n%s\nwant:\n%s", got, want)
	}
}

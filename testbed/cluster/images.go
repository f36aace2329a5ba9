package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Image names. PauseImage is containerd's sandbox_image; pods run BusyboxImage with
// imagePullPolicy Never or IfNotPresent: the cluster has no registry.
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	BusyboxImage = "docker.io/library/busybox:nodefence"
)

// pauseSource is the sandbox's init: it waits for signals, reaps orphans, and exits on SIGINT or
// SIGTERM.
const pauseSource = `#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction down = {0}, child = {0};
	down.sa_handler = stop;
	child.sa_handler = reap;
	child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	sigaction(SIGINT, &down, NULL);
	sigaction(SIGTERM, &down, NULL);
	sigaction(SIGCHLD, &child, NULL);
	for (;;) {
		pause();
	}
}
`

// file is one entry of an image layer.
type file struct {
	Name string // path inside the image, without a leading slash
	Mode int64
	Data []byte
	Link string // a symlink's target; Data is then unused
	Dir  bool
}

// imageConfig is the part of an OCI/Docker image configuration the testbed sets.
type imageConfig struct {
	Entrypoint []string
	Cmd        []string
}

// dockerArchive builds a `docker save` archive of a one-layer image named name: manifest.json,
// the configuration and the layer, named by their sha256 digests, which is what `ctr images
// import` reads. The output is deterministic (sorted entries, zero times, owner root).
func dockerArchive(name string, files []file, cfg imageConfig) ([]byte, error) {
	layer, err := tarball(files)
	if err != nil {
		return nil, err
	}
	layerSum := sha256.Sum256(layer)
	diffID := hex.EncodeToString(layerSum[:])
	conf := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      "1970-01-01T00:00:00Z",
		"config": map[string]any{
			"Env":        []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"},
			"Entrypoint": cfg.Entrypoint,
			"Cmd":        cfg.Cmd,
			"WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
		"history": []map[string]string{{"created": "1970-01-01T00:00:00Z", "created_by": "nodefence testbed"}},
	}
	confJSON, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	confSum := sha256.Sum256(confJSON)
	confName := hex.EncodeToString(confSum[:]) + ".json"
	layerName := diffID + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{"Config": confName, "RepoTags": []string{name}, "Layers": []string{layerName}}})
	if err != nil {
		return nil, err
	}
	return tarball([]file{
		{Name: "manifest.json", Mode: 0o644, Data: manifest},
		{Name: confName, Mode: 0o644, Data: confJSON},
		{Name: diffID, Mode: 0o755, Dir: true},
		{Name: layerName, Mode: 0o644, Data: layer},
	})
}

// tarball writes files, sorted by name, into a tar archive.
func tarball(files []file) ([]byte, error) {
	sorted := append([]file(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, Typeflag: tar.TypeReg, Size: int64(len(f.Data)), Format: tar.FormatPAX}
		switch {
		case f.Dir:
			h.Typeflag, h.Name, h.Size = tar.TypeDir, strings.TrimSuffix(f.Name, "/")+"/", 0
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.Link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// buildImages writes pause.tar and busybox.tar into dir, unless they are there already.
func buildImages(dir string) (pause, busybox string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	pause, busybox = filepath.Join(dir, "pause.tar"), filepath.Join(dir, "busybox.tar")
	if _, err := os.Stat(pause); err != nil {
		bin, err := compilePause(dir)
		if err != nil {
			return "", "", err
		}
		tarData, err := dockerArchive(PauseImage, []file{{Name: "pause", Mode: 0o755, Data: bin}}, imageConfig{Entrypoint: []string{"/pause"}})
		if err != nil {
			return "", "", err
		}
		if err := writeFileAtomic(pause, tarData); err != nil {
			return "", "", err
		}
	}
	if _, err := os.Stat(busybox); err != nil {
		files, err := busyboxRootfs()
		if err != nil {
			return "", "", err
		}
		tarData, err := dockerArchive(BusyboxImage, files, imageConfig{Cmd: []string{"sh"}})
		if err != nil {
			return "", "", err
		}
		if err := writeFileAtomic(busybox, tarData); err != nil {
			return "", "", err
		}
	}
	return pause, busybox, nil
}

// compilePause compiles pauseSource with gcc into a static binary and returns it.
func compilePause(dir string) ([]byte, error) {
	src, out := filepath.Join(dir, "pause.c"), filepath.Join(dir, "pause")
	if err := os.WriteFile(src, []byte(pauseSource), 0o644); err != nil {
		return nil, err
	}
	if msg, err := exec.Command("gcc", "-Os", "-static", "-o", out, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gcc pause.c (Debian package gcc): %w: %s", err, msg)
	}
	return os.ReadFile(out)
}

// busyboxRootfs is Debian's static busybox with a symlink per applet, /etc/passwd and /etc/group
// for root, and /tmp.
func busyboxRootfs() ([]file, error) {
	bin, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox (Debian package busybox-static): %w", err)
	}
	list, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	files := []file{
		{Name: "bin", Mode: 0o755, Dir: true}, {Name: "sbin", Mode: 0o755, Dir: true},
		{Name: "usr", Mode: 0o755, Dir: true}, {Name: "usr/bin", Mode: 0o755, Dir: true},
		{Name: "usr/sbin", Mode: 0o755, Dir: true}, {Name: "etc", Mode: 0o755, Dir: true},
		{Name: "tmp", Mode: 0o1777, Dir: true},
		{Name: "bin/busybox", Mode: 0o755, Data: bin},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	seen := map[string]bool{"bin/busybox": true}
	for _, p := range strings.Fields(string(list)) {
		p = strings.TrimPrefix(path.Clean(p), "/")
		if seen[p] || strings.Count(p, "/") > 2 {
			continue
		}
		seen[p] = true
		files = append(files, file{Name: p, Mode: 0o777, Link: "/bin/busybox"})
	}
	return files, nil
}

func writeFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

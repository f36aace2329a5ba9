package signals

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

func TestLayout(t *testing.T) {
	fs := func(dev uint64) FSStats { return FSStats{Device: dev, Path: "/p"} }
	tests := []struct {
		name                   string
		node, image, container uint64
		want                   eviction.Layout
		wantErr                bool
	}{
		{"everything on nodefs", 1, 1, 1, eviction.LayoutSingle, false},
		{"split disk: imagefs holds images and writable layers", 1, 2, 2, eviction.LayoutSplitDisk, false},
		{"split image: containerfs on the root fs, images apart", 1, 2, 1, eviction.LayoutSplitImage, false},
		{"containerfs alone", 1, 1, 2, 0, true},
		{"three filesystems", 1, 2, 3, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Layout(fs(tt.node), fs(tt.image), fs(tt.container))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("Layout = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// mountTmpfs mounts a tmpfs of the given size on a new directory, or skips when not allowed.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",nr_inodes=1000"); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot mount a tmpfs: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestDisksOnRealFilesystems measures real mounts in the three layouts: nodefs on the test's temp
// filesystem, imagefs and containerfs on tmpfs mounts whose size and inode count are known.
func TestDisksOnRealFilesystems(t *testing.T) {
	node := t.TempDir()
	image := mountTmpfs(t, "16m")
	if err := os.WriteFile(filepath.Join(image, "layer"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		paths FSPaths
		want  eviction.Layout
	}{
		{"single", FSPaths{NodeFS: node}, eviction.LayoutSingle},
		{"split disk", FSPaths{NodeFS: node, ImageFS: image}, eviction.LayoutSplitDisk},
		{"split image", FSPaths{NodeFS: node, ImageFS: image, ContainerFS: node}, eviction.LayoutSplitImage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Reader{ProcRoot: "testdata/proc", CgroupRoot: "testdata/v1", FS: tt.paths}
			_, _, _, layout, err := tt.paths.Disks()
			if err != nil || layout != tt.want {
				t.Fatalf("Disks: layout %v, %v; want %v", layout, err, tt.want)
			}
			sigs, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			obs := Observations(sigs)
			if len(obs) != 8 {
				t.Fatalf("got %d signals, want memory, pid and six filesystem signals: %v", len(obs), sigs)
			}
			img := obs[eviction.SignalImageFSAvailable]
			if tt.want != eviction.LayoutSingle {
				if img.Capacity != 16<<20 || img.Available != 15<<20 {
					t.Errorf("imagefs = %+v, want 16Mi capacity with 15Mi available", img)
				}
				if in := obs[eviction.SignalImageFSInodesFree]; in.Capacity != 1000 || in.Available != 998 {
					t.Errorf("imagefs inodes = %+v, want 998 of 1000 free (root dir and one file)", in)
				}
			}
			cfs, nfs := obs[eviction.SignalContainerFSAvailable], obs[eviction.SignalNodeFSAvailable]
			switch tt.want {
			case eviction.LayoutSplitDisk:
				if cfs.Capacity != img.Capacity {
					t.Errorf("split disk: containerfs %+v, want imagefs's %+v", cfs, img)
				}
			default:
				if cfs.Capacity != nfs.Capacity {
					t.Errorf("%v: containerfs %+v, want nodefs's %+v", tt.want, cfs, nfs)
				}
			}
		})
	}
}

// TestStatFSCountsFragmentSize: capacity is f_blocks * f_frsize, as cadvisor counts it, checked
// against coreutils' stat -f (%S is the fundamental block size, f_frsize).
func TestStatFSCountsFragmentSize(t *testing.T) {
	for _, path := range []string{"/", os.TempDir()} {
		out, err := exec.Command("stat", "-f", "-c", "%S %b", path).Output()
		if err != nil {
			t.Skipf("stat -f: %v", err)
		}
		var frsize, blocks int64
		if _, err := fmt.Sscan(string(out), &frsize, &blocks); err != nil {
			t.Fatal(err)
		}
		got, err := StatFS(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Capacity != frsize*blocks {
			t.Errorf("%s: capacity %d, want %d (f_frsize %d * f_blocks %d)", path, got.Capacity, frsize*blocks, frsize, blocks)
		}
	}
}

package kubepods

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

var diskPod = PodRef{Namespace: "shop", Name: "cart-0", UID: fixtureUID}

// diskLayout builds a kubelet root and a pod log directory in temp dirs and tallies, from each
// created path's own lstat, what Disk should count.
type diskLayout struct {
	t                *testing.T
	kubelet, logs    string
	bytes, inodes    eviction.DiskUsage
	volumes, podLogs string // the pod's emptyDir and log directories
	outside          string // a directory no walk may count
	countedInLogs    bool   // the next paths add to Logs rather than LocalVolumes
	countedNowhere   bool   // the next paths add to nothing
}

func newDiskLayout(t *testing.T, pod PodRef) *diskLayout {
	l := &diskLayout{t: t, kubelet: t.TempDir(), logs: t.TempDir(), outside: t.TempDir()}
	l.volumes = filepath.Join(l.kubelet, "pods", pod.UID, "volumes", "kubernetes.io~empty-dir")
	l.podLogs = filepath.Join(l.logs, pod.Namespace+"_"+pod.Name+"_"+pod.UID)
	return l
}

func (l *diskLayout) disk() *Disk { return &Disk{KubeletRoot: l.kubelet, PodLogDir: l.logs} }

// count adds path's allocated bytes and one inode to the part being built.
func (l *diskLayout) count(path string) {
	l.t.Helper()
	if l.countedNowhere {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		l.t.Fatal(err)
	}
	b := fi.Sys().(*syscall.Stat_t).Blocks * 512
	if l.countedInLogs {
		l.bytes.Logs += b
		l.inodes.Logs++
	} else {
		l.bytes.LocalVolumes += b
		l.inodes.LocalVolumes++
	}
}

// dir creates path and its parents; only path itself is counted.
func (l *diskLayout) dir(path string) string {
	l.t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		l.t.Fatal(err)
	}
	l.count(path)
	return path
}

// file writes size bytes of data (not a sparse file) to path, in an existing directory.
func (l *diskLayout) file(path string, size int) string {
	l.t.Helper()
	if err := os.WriteFile(path, []byte(strings.Repeat("x", size)), 0o644); err != nil {
		l.t.Fatal(err)
	}
	l.count(path)
	return path
}

func (l *diskLayout) symlink(target, path string) {
	l.t.Helper()
	if err := os.Symlink(target, path); err != nil {
		l.t.Fatal(err)
	}
	l.count(path)
}

// link hard-links path to target; it is not counted again.
func (l *diskLayout) link(target, path string) {
	l.t.Helper()
	if err := os.Link(target, path); err != nil {
		l.t.Fatal(err)
	}
}

func (l *diskLayout) want() DiskResult { return DiskResult{Bytes: l.bytes, Inodes: l.inodes} }

// mountTmpfs mounts a tmpfs on dir until the end of the test, or skips the test.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16m"); err != nil {
		t.Skipf("cannot mount a tmpfs for a memory-backed emptyDir (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

func TestDiskMeasure(t *testing.T) {
	tests := []struct {
		name  string
		build func(l *diskLayout)
	}{
		{"missing pod directories", func(*diskLayout) {}},
		{"emptyDirs and logs, nested, other pods not counted", func(l *diskLayout) {
			cache := l.dir(filepath.Join(l.volumes, "cache"))
			l.file(filepath.Join(cache, "a"), 10_000)
			sub := l.dir(filepath.Join(cache, "sub"))
			deep := l.dir(filepath.Join(sub, "deeper"))
			l.file(filepath.Join(sub, "b"), 100_000)
			l.file(filepath.Join(deep, "c"), 1)
			l.file(filepath.Join(deep, "empty"), 0)
			scratch := l.dir(filepath.Join(l.volumes, "scratch"))
			l.file(filepath.Join(scratch, "d"), 300_000)
			l.countedInLogs = true
			app := l.dir(filepath.Join(l.dir(l.podLogs), "app"))
			l.file(filepath.Join(app, "0.log"), 5_000)
			l.file(filepath.Join(app, "0.log.20260101-000000.gz"), 70_000)
			l.countedNowhere = true
			other := l.dir(filepath.Join(l.kubelet, "pods", "2222bbbb-0000-4000-8000-000000000002", "volumes", "kubernetes.io~empty-dir", "cache"))
			l.file(filepath.Join(other, "big"), 500_000)
			l.file(filepath.Join(l.dir(l.podLogs+"x"), "0.log"), 500_000)
			l.file(filepath.Join(l.dir(filepath.Join(l.kubelet, "pods", fixtureUID, "volumes", "kubernetes.io~configmap", "cfg")), "k"), 500_000)
		}},
		{"only logs", func(l *diskLayout) {
			l.countedInLogs = true
			l.file(filepath.Join(l.dir(filepath.Join(l.dir(l.podLogs), "app")), "0.log"), 12_345)
		}},
		{"symlinks are not followed", func(l *diskLayout) {
			vol := l.dir(filepath.Join(l.volumes, "data"))
			big := filepath.Join(l.outside, "big")
			if err := os.WriteFile(big, make([]byte, 1<<20), 0o644); err != nil {
				l.t.Fatal(err)
			}
			l.symlink(big, filepath.Join(vol, "to-file"))
			l.symlink(l.outside, filepath.Join(vol, "to-dir"))
			l.countedInLogs = true
			l.dir(l.podLogs)
			l.symlink(l.outside, filepath.Join(l.podLogs, "app"))
		}},
		{"a hard link is counted once per pod", func(l *diskLayout) {
			vol := l.dir(filepath.Join(l.volumes, "data"))
			x := l.file(filepath.Join(vol, "x"), 200_000)
			l.link(x, filepath.Join(vol, "y"))
			sub := l.dir(filepath.Join(vol, "sub"))
			l.link(x, filepath.Join(sub, "z"))
			l.countedInLogs = true
			l.dir(l.podLogs)
			l.link(x, filepath.Join(l.podLogs, "x.log"))
			l.file(filepath.Join(l.podLogs, "own.log"), 3_000)
		}},
		{"a memory-backed emptyDir is memory, not disk", func(l *diskLayout) {
			l.countedNowhere = true
			mem := l.dir(filepath.Join(l.volumes, "shm"))
			mountTmpfs(l.t, mem)
			l.file(filepath.Join(mem, "in-memory"), 1<<20)
			l.countedNowhere = false
			l.file(filepath.Join(l.dir(filepath.Join(l.volumes, "on-disk")), "f"), 40_000)
		}},
		{"another filesystem mounted inside an emptyDir is not walked", func(l *diskLayout) {
			vol := l.dir(filepath.Join(l.volumes, "data"))
			l.file(filepath.Join(vol, "f"), 40_000)
			l.countedNowhere = true
			mnt := l.dir(filepath.Join(vol, "mnt"))
			mountTmpfs(l.t, mnt)
			l.file(filepath.Join(mnt, "elsewhere"), 1<<20)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newDiskLayout(t, diskPod)
			tt.build(l)
			got := l.disk().Measure(diskPod)
			if got.Err != nil {
				t.Errorf("Measure: %v", got.Err)
			}
			if diff := cmp.Diff(l.want(), got, cmpErrors); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// The layouts must mean something: files of a few hundred kB take blocks on the test's
	// filesystem, or the comparisons above could pass on zeros.
	l := newDiskLayout(t, diskPod)
	l.file(filepath.Join(l.dir(filepath.Join(l.volumes, "v")), "f"), 300_000)
	if got := l.disk().Measure(diskPod).Bytes.LocalVolumes; got < 200_000 {
		t.Errorf("a 300 kB file and its directory count %d bytes; want at least 200 kB", got)
	}
}

func TestDiskMeasureRefusesOddNames(t *testing.T) {
	l := newDiskLayout(t, diskPod)
	for _, p := range []PodRef{{"shop", "cart-0", ""}, {"shop", "cart-0", ".."}, {"..", "x", fixtureUID}, {"shop", "a/b", fixtureUID}} {
		if got := l.disk().Measure(p); got.Err == nil || got.Bytes != (eviction.DiskUsage{}) {
			t.Errorf("Measure(%+v) = %+v; want an error and nothing measured", p, got)
		}
	}
}

var cmpErrors = cmp.Comparer(func(a, b error) bool { return (a == nil) == (b == nil) })

// TestDiskWalkLimit: a pod with more entries than MaxEntries is counted up to the bound, and says so.
func TestDiskWalkLimit(t *testing.T) {
	l := newDiskLayout(t, diskPod)
	vol := l.dir(filepath.Join(l.volumes, "many"))
	for i := range 10 {
		l.file(filepath.Join(vol, strings.Repeat("f", i+1)), 100)
	}
	l.countedInLogs = true
	l.file(filepath.Join(l.dir(l.podLogs), "0.log"), 100)

	d := l.disk()
	d.MaxEntries = 13 // exactly what there is: 1 directory + 10 files, 1 directory + 1 file
	if got := d.Measure(diskPod); got.Err != nil || got.Inodes.LocalVolumes != 11 || got.Inodes.Logs != 2 {
		t.Errorf("MaxEntries = all entries: %+v; want every entry and no error", got)
	}
	d.MaxEntries = 5
	got := d.Measure(diskPod)
	if !errors.Is(got.Err, ErrWalkLimit) {
		t.Errorf("err = %v; want ErrWalkLimit", got.Err)
	}
	if got.Inodes.LocalVolumes != 5 || got.Inodes.Logs != 0 || got.Bytes.LocalVolumes <= 0 || got.Bytes.LocalVolumes >= l.bytes.LocalVolumes {
		t.Errorf("MaxEntries = 5: %+v; want the first 5 volume entries only", got)
	}
	if !strings.Contains(got.Err.Error(), diskPod.UID) {
		t.Errorf("err %q does not name the pod", got.Err)
	}
}

// TestDiskCache: a result is reused for TTL, forgotten with its pod, and a clock going back
// measures again.
func TestDiskCache(t *testing.T) {
	l := newDiskLayout(t, diskPod)
	vol := l.dir(filepath.Join(l.volumes, "v"))
	d := l.disk()
	d.TTL = 10 * time.Second
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	pods := []PodRef{diskPod}
	read := func(at time.Duration) int64 {
		t.Helper()
		r := d.ReadDisk(pods, t0.Add(at))
		if len(r) != len(pods) {
			t.Fatalf("%d results for %d pods", len(r), len(pods))
		}
		if r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
		return r[0].Inodes.LocalVolumes
	}
	if n := read(0); n != 1 {
		t.Fatalf("inodes %d; want 1", n)
	}
	l.file(filepath.Join(vol, "a"), 10)
	if n := read(9 * time.Second); n != 1 {
		t.Errorf("at 9s: inodes %d; want the cached 1", n)
	}
	if n := read(10 * time.Second); n != 2 {
		t.Errorf("at 10s: inodes %d; want 2, measured again", n)
	}
	l.file(filepath.Join(vol, "b"), 10)
	if n := read(5 * time.Second); n != 3 {
		t.Errorf("clock back to 5s: inodes %d; want 3, measured again", n)
	}

	other := PodRef{Namespace: "shop", Name: "cart-1", UID: "2222bbbb-0000-4000-8000-000000000002"}
	pods = []PodRef{other, diskPod, diskPod}
	r := d.ReadDisk(pods, t0.Add(6*time.Second))
	if len(r) != 3 || r[1].Inodes.LocalVolumes != 3 || r[2] != r[1] || r[0] != (DiskResult{}) {
		t.Errorf("three pods: %+v", r)
	}
	d.ReadDisk(nil, t0.Add(7*time.Second))
	if len(d.cache) != 0 {
		t.Errorf("the cache holds %d pods after a list without any", len(d.cache))
	}
	l.file(filepath.Join(vol, "c"), 10)
	pods = []PodRef{diskPod}
	if n := read(8 * time.Second); n != 4 {
		t.Errorf("a forgotten pod: inodes %d; want 4, measured again", n)
	}

	d.TTL = -1
	l.file(filepath.Join(vol, "d"), 10)
	if n := read(8 * time.Second); n != 5 {
		t.Errorf("TTL < 0: inodes %d; want 5, measured every time", n)
	}
}

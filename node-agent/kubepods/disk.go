package kubepods

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// Defaults of Disk.
const (
	DefaultKubeletRoot = "/var/lib/kubelet"
	DefaultPodLogDir   = "/var/log/pods"
	// DefaultDiskTTL is how long a pod's measured disk use is reused before it is walked again.
	DefaultDiskTTL = 10 * time.Second
	// DefaultMaxEntries bounds the entries (files, directories, links) walked for one pod.
	DefaultMaxEntries = 1_000_000
)

// ErrWalkLimit says a pod's walk stopped at Disk.MaxEntries: its figures are lower bounds.
var ErrWalkLimit = errors.New("kubepods: too many entries, walk stopped")

// PodRef names a pod the way its directories on the node do.
type PodRef struct {
	Namespace, Name, UID string
}

// DiskResult is a pod's measured disk use: Bytes in allocated bytes (st_blocks*512, as du counts),
// Inodes in distinct inodes. Err, when set, says the figures are what was counted before or
// around a failure (ErrWalkLimit among them); the pod keeps them.
type DiskResult struct {
	Bytes, Inodes eviction.DiskUsage
	Err           error
}

// DiskReader measures pods' disk use; Disk is the real one. An interface so that a Source can run
// without the kubelet's directories (a test, or a node where they are not mounted).
type DiskReader interface {
	// ReadDisk returns the disk use of each of pods, in order, at now. It may forget what it kept
	// about pods not in the list.
	ReadDisk(pods []PodRef, now time.Time) []DiskResult
}

// Disk measures pods' disk use from the kubelet's directories, as the kubelet's stats do for its
// eviction ranking, without a container runtime:
//
//   - LocalVolumes: everything under <KubeletRoot>/pods/<uid>/volumes/kubernetes.io~empty-dir/<vol>,
//     except the emptyDirs that are a tmpfs (medium: Memory): the kubelet counts those as memory.
//     The kubelet also counts configMap, downwardAPI and gitRepo volumes; those are not measured.
//   - Logs: everything under <PodLogDir>/<namespace>_<name>_<uid>.
//   - Writable (the containers' writable layers) and Images need the container runtime (CRI
//     stats) and stay 0: a pod that fills its root filesystem is not seen here.
//
// Walks do not follow symbolic links (a link counts as itself), do not cross into other
// filesystems mounted below a walk's root (du -x), and count a hard-linked inode once per pod.
// A missing directory counts 0. A pod's result is reused for TTL, keyed by uid. Use a *Disk; its
// fields must not change once it is in use.
type Disk struct {
	// KubeletRoot is the kubelet's --root-dir (default DefaultKubeletRoot).
	KubeletRoot string
	// PodLogDir is where the kubelet keeps pod logs (default DefaultPodLogDir).
	PodLogDir string
	// TTL is how long a measurement is reused (0: DefaultDiskTTL; negative: never).
	TTL time.Duration
	// MaxEntries bounds one pod's walk (0: DefaultMaxEntries): past it the walk stops and the pod's
	// result carries ErrWalkLimit, so one pathological pod cannot stall the agent.
	MaxEntries int

	mu    sync.Mutex
	cache map[string]diskEntry // by pod uid
}

type diskEntry struct {
	at     time.Time
	result DiskResult
}

// ReadDisk implements DiskReader: a pod measured less than TTL before now gets the same result
// again; the others are walked. Pods not in the list are forgotten.
func (d *Disk) ReadDisk(pods []PodRef, now time.Time) []DiskResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	ttl := d.TTL
	if ttl == 0 {
		ttl = DefaultDiskTTL
	}
	next := make(map[string]diskEntry, len(pods))
	out := make([]DiskResult, len(pods))
	for i, p := range pods {
		e, ok := next[p.UID]
		if !ok {
			e, ok = d.cache[p.UID]
			if !ok || now.Before(e.at) || now.Sub(e.at) >= ttl {
				e = diskEntry{at: now, result: d.Measure(p)}
			}
			next[p.UID] = e
		}
		out[i] = e.result
	}
	d.cache = next
	return out
}

// Measure walks one pod's directories now, without the cache.
func (d *Disk) Measure(p PodRef) DiskResult {
	for _, s := range []string{p.Namespace, p.Name, p.UID} {
		if s == "" || s == "." || s == ".." || strings.Contains(s, "/") {
			return DiskResult{Err: fmt.Errorf("pod %q/%q (%q): not a pod's directory names", p.Namespace, p.Name, p.UID)}
		}
	}
	root, logs := d.KubeletRoot, d.PodLogDir
	if root == "" {
		root = DefaultKubeletRoot
	}
	if logs == "" {
		logs = DefaultPodLogDir
	}
	limit := d.MaxEntries
	if limit <= 0 {
		limit = DefaultMaxEntries
	}
	w := &walker{left: limit, seen: map[fileID]struct{}{}}
	var r DiskResult
	var errs []error

	emptyDirs := filepath.Join(root, "pods", p.UID, "volumes", "kubernetes.io~empty-dir")
	vols, err := os.ReadDir(emptyDirs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, v := range vols {
		dir := filepath.Join(emptyDirs, v.Name())
		if v.IsDir() {
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, fmt.Errorf("statfs %s: %w", dir, err))
				}
				continue
			}
			if st.Type == unix.TMPFS_MAGIC {
				continue // medium: Memory, counted as the pod's memory
			}
		}
		errs = append(errs, w.walk(dir, &r.Bytes.LocalVolumes, &r.Inodes.LocalVolumes))
	}
	dir := filepath.Join(logs, p.Namespace+"_"+p.Name+"_"+p.UID)
	errs = append(errs, w.walk(dir, &r.Bytes.Logs, &r.Inodes.Logs))
	if w.left < 0 {
		errs = append(errs, fmt.Errorf("%w after %d entries", ErrWalkLimit, limit))
	}
	r.Err = errors.Join(errs...)
	if r.Err != nil {
		r.Err = fmt.Errorf("pod %s/%s (%s): %w", p.Namespace, p.Name, p.UID, r.Err)
	}
	return r
}

// fileID is an inode's identity.
type fileID struct{ dev, ino uint64 }

// walker counts one pod's entries: left is what MaxEntries still allows (negative once the walk
// was cut short), seen the hard-linked inodes already counted.
type walker struct {
	left int
	seen map[fileID]struct{}
}

// walk adds the allocated bytes and inodes of root and everything under it to bytes and inodes.
// It skips what vanished meanwhile (logs rotate) and goes on past other errors, returning the first.
func (w *walker) walk(root string, bytes, inodes *int64) error {
	var dev uint64
	var first error
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if path == root && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipAll
			}
			if !errors.Is(err, fs.ErrNotExist) && first == nil {
				first = err
			}
			return nil // a directory that cannot be read is still counted itself
		}
		info, err := e.Info() // lstat: links are not followed
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) && first == nil {
				first = err
			}
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", path)
		}
		if path == root {
			dev = uint64(st.Dev)
		} else if uint64(st.Dev) != dev {
			if e.IsDir() {
				return filepath.SkipDir // another filesystem mounted here
			}
			return nil
		}
		if w.left--; w.left < 0 {
			return filepath.SkipAll
		}
		if !e.IsDir() && uint64(st.Nlink) > 1 {
			id := fileID{uint64(st.Dev), uint64(st.Ino)}
			if _, dup := w.seen[id]; dup {
				return nil
			}
			w.seen[id] = struct{}{}
		}
		*bytes += int64(st.Blocks) * 512
		*inodes++
		return nil
	})
	if first == nil {
		first = err
	}
	return first
}

// VolumesPresent reports whether any volume of the pod with this uid is still set up under the
// kubelet's root dir (<root>/pods/<uid>/volumes/<plugin>/<name>): kubelet tears each volume down,
// and removes its directory, before it counts the pod's resources as reclaimed (podVolumesExist in
// its podResourcesAreReclaimed). A memory-backed emptyDir's pages stay charged to the pods' cgroup
// until then.
func (d *Disk) VolumesPresent(uid string) bool {
	root := d.KubeletRoot
	if root == "" {
		root = DefaultKubeletRoot
	}
	plugins, err := os.ReadDir(filepath.Join(root, "pods", filepath.Base(uid), "volumes"))
	if err != nil {
		return false // no volumes directory: nothing left to tear down
	}
	for _, p := range plugins {
		if vols, err := os.ReadDir(filepath.Join(root, "pods", filepath.Base(uid), "volumes", p.Name())); err == nil && len(vols) > 0 {
			return true
		}
	}
	return false
}

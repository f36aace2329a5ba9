package signals

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Signal names, as kubelet spells them.
const (
	MemoryAvailable = "memory.available"
	PIDAvailable    = "pid.available"
)

// CgroupVersion selects the cgroup hierarchy memory is read from.
type CgroupVersion int

const (
	// CgroupAuto detects the version from the files under the cgroup root (see Reader.Detect).
	CgroupAuto CgroupVersion = iota
	// CgroupV1 reads the v1 memory controller hierarchy (<root>/memory).
	CgroupV1
	// CgroupV2 reads the unified hierarchy (<root>, or <root>/unified on a hybrid host).
	CgroupV2
)

// ParseCgroupVersion parses "auto", "1" or "2".
func ParseCgroupVersion(s string) (CgroupVersion, error) {
	switch s {
	case "auto", "":
		return CgroupAuto, nil
	case "1", "v1":
		return CgroupV1, nil
	case "2", "v2":
		return CgroupV2, nil
	}
	return CgroupAuto, fmt.Errorf("cgroup version %q: want auto, 1 or 2", s)
}

func (v CgroupVersion) String() string {
	switch v {
	case CgroupAuto:
		return "auto"
	case CgroupV1:
		return "1"
	case CgroupV2:
		return "2"
	}
	return fmt.Sprintf("CgroupVersion(%d)", int(v))
}

// Default roots.
const (
	DefaultProcRoot   = "/proc"
	DefaultCgroupRoot = "/sys/fs/cgroup"
)

// Reader reads eviction signals from procfs and cgroupfs. The zero value reads the host's node-level
// signals from /proc and /sys/fs/cgroup with the cgroup version detected. A Reader holds no state
// and is safe for concurrent use.
type Reader struct {
	// ProcRoot is where procfs is mounted (default /proc).
	ProcRoot string
	// CgroupRoot is where the cgroup filesystems are mounted (default /sys/fs/cgroup): either the v2
	// unified hierarchy itself, or a tmpfs holding the v1 controllers (memory/, ...) and possibly a
	// v2 mount at unified/.
	CgroupRoot string
	// CgroupVersion forces v1 or v2; CgroupAuto detects it.
	CgroupVersion CgroupVersion
	// CgroupPath is the cgroup whose memory is measured, relative to the hierarchy root. Empty (the
	// root cgroup) gives kubelet's node-level memory.available; e.g. "kubepods" gives the
	// allocatable-level value.
	CgroupPath string
	// FS are the nodefs, imagefs and containerfs paths; the zero value reads no filesystem signal.
	FS FSPaths
	// PodsCgroups, when set, are the candidate paths of the kubelet's pods cgroup (relative to the
	// hierarchy root; see DefaultPodsCgroups): Read then adds allocatableMemory.available.
	PodsCgroups []string
}

func (r Reader) procRoot() string   { return cmpOr(r.ProcRoot, DefaultProcRoot) }
func (r Reader) cgroupRoot() string { return cmpOr(r.CgroupRoot, DefaultCgroupRoot) }

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Detect returns the cgroup version in use and the directory of the hierarchy's root cgroup.
//
// With CgroupAuto, the order mirrors what runc and cadvisor (and so kubelet) do: if the cgroup root is
// itself a v2 hierarchy (it has cgroup.controllers) memory comes from v2; otherwise, if the v1 memory
// controller is mounted (<root>/memory/memory.usage_in_bytes), memory comes from v1 — on a hybrid host
// the unified/ mount carries no memory controller that kubelet would use; only when neither is there
// is <root>/unified used as v2.
func (r Reader) Detect() (CgroupVersion, string, error) {
	root := r.cgroupRoot()
	unifiedDir := func() string {
		if exists(filepath.Join(root, "cgroup.controllers")) {
			return root
		}
		return filepath.Join(root, "unified")
	}
	switch r.CgroupVersion {
	case CgroupV1:
		return CgroupV1, filepath.Join(root, "memory"), nil
	case CgroupV2:
		return CgroupV2, unifiedDir(), nil
	case CgroupAuto:
	default:
		return 0, "", fmt.Errorf("cgroup version %v: want auto, 1 or 2", r.CgroupVersion)
	}
	switch {
	case exists(filepath.Join(root, "cgroup.controllers")):
		return CgroupV2, root, nil
	case exists(filepath.Join(root, "memory", "memory.usage_in_bytes")):
		return CgroupV1, filepath.Join(root, "memory"), nil
	case exists(filepath.Join(root, "unified", "cgroup.controllers")):
		return CgroupV2, filepath.Join(root, "unified"), nil
	}
	return 0, "", fmt.Errorf("no cgroup v1 memory controller or v2 hierarchy under %s", root)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Memory is one reading of memory.available and the values it is computed from, all in bytes.
type Memory struct {
	// Capacity is MemTotal from /proc/meminfo (kubelet's machine memory capacity).
	Capacity int64
	// Usage is the cgroup's memory usage (see Reader.Memory for where it comes from).
	Usage int64
	// InactiveFile is the cgroup's inactive file cache, which the kernel can reclaim cheaply.
	InactiveFile int64
	// WorkingSet is Usage - InactiveFile, floored at 0.
	WorkingSet int64
	// Available is Capacity - WorkingSet, floored at 0: kubelet's memory.available.
	Available int64
	// Source says where Usage and InactiveFile were read, for logs and tests.
	Source string
}

// ComputeMemory applies kubelet's (cadvisor's) formula: working set = usage - inactive_file, floored
// at 0; memory.available = capacity - working set, floored at 0. Values above math.MaxInt64 are
// clamped.
func ComputeMemory(capacity, usage, inactiveFile uint64) Memory {
	ws := uint64(0)
	if usage > inactiveFile {
		ws = usage - inactiveFile
	}
	avail := uint64(0)
	if capacity > ws {
		avail = capacity - ws
	}
	return Memory{
		Capacity: clamp(capacity), Usage: clamp(usage), InactiveFile: clamp(inactiveFile),
		WorkingSet: clamp(ws), Available: clamp(avail),
	}
}

func clamp(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// Memory reads memory.available.
//
//   - cgroup v1: usage = memory.usage_in_bytes, inactive = memory.stat total_inactive_file (the
//     hierarchical value, as cadvisor uses).
//   - cgroup v2, any cgroup that has memory.current: usage = memory.current, inactive = memory.stat
//     inactive_file.
//   - cgroup v2 root cgroup, which has no memory.current: as runc's fs2 does (and cadvisor, and so
//     kubelet, with it), usage = anon + file from the root memory.stat and inactive = its
//     inactive_file. If the root has no memory.stat either (the memory controller is not in the
//     unified hierarchy, as on a hybrid v1+v2 host), usage = MemTotal - MemFree and inactive =
//     Inactive(file), both from /proc/meminfo — what older runc versions used for the root cgroup.
//
// Capacity is always MemTotal from /proc/meminfo.
func (r Reader) Memory() (Memory, error) {
	mi, err := r.meminfo()
	if err != nil {
		return Memory{}, err
	}
	capacity, ok := mi["MemTotal"]
	if !ok {
		return Memory{}, errors.New("meminfo: no MemTotal")
	}
	version, dir, err := r.Detect()
	if err != nil {
		return Memory{}, err
	}
	cg := filepath.Join(dir, filepath.Clean("/"+r.CgroupPath))
	isRoot := cg == filepath.Clean(dir)

	switch version {
	case CgroupV1:
		usage, err := readUint(filepath.Join(cg, "memory.usage_in_bytes"))
		if err != nil {
			return Memory{}, err
		}
		inactive, err := readStatKey(filepath.Join(cg, "memory.stat"), "total_inactive_file")
		if err != nil {
			return Memory{}, err
		}
		m := ComputeMemory(capacity, usage, inactive)
		m.Source = "cgroup v1 " + cg
		return m, nil
	}

	usage, err := readUint(filepath.Join(cg, "memory.current"))
	if err == nil {
		inactive, err := readStatKey(filepath.Join(cg, "memory.stat"), "inactive_file")
		if err != nil {
			return Memory{}, err
		}
		m := ComputeMemory(capacity, usage, inactive)
		m.Source = "cgroup v2 " + cg
		return m, nil
	}
	if !errors.Is(err, fs.ErrNotExist) || !isRoot {
		return Memory{}, err
	}
	return rootV2Memory(cg, capacity, mi)
}

// rootV2Memory is memory.available of a cgroup v2 root, which has no memory.current: from its
// memory.stat, or, without a memory controller, from /proc/meminfo (mi).
func rootV2Memory(cg string, capacity uint64, mi map[string]uint64) (Memory, error) {
	statPath := filepath.Join(cg, "memory.stat")
	data, err := os.ReadFile(statPath)
	switch {
	case err == nil:
		stat, err := ParseMemoryStat(data)
		if err != nil {
			return Memory{}, fmt.Errorf("%s: %w", statPath, err)
		}
		anon, okA := stat["anon"]
		file, okF := stat["file"]
		inactive, okI := stat["inactive_file"]
		if !okA || !okF || !okI {
			return Memory{}, fmt.Errorf("%s: want anon, file and inactive_file", statPath)
		}
		usage := anon + file
		if usage < anon { // overflow: a corrupt file, not a real machine
			return Memory{}, fmt.Errorf("%s: anon + file overflows", statPath)
		}
		m := ComputeMemory(capacity, usage, inactive)
		m.Source = "cgroup v2 root memory.stat " + cg
		return m, nil
	case errors.Is(err, fs.ErrNotExist):
		free, okF := mi["MemFree"]
		inactive, okI := mi["Inactive(file)"]
		if !okF || !okI {
			return Memory{}, errors.New("meminfo: want MemFree and Inactive(file)")
		}
		used := uint64(0)
		if capacity > free {
			used = capacity - free
		}
		m := ComputeMemory(capacity, used, inactive)
		m.Source = "meminfo (cgroup v2 root without memory controller)"
		return m, nil
	default:
		return Memory{}, err
	}
}

func (r Reader) meminfo() (map[string]uint64, error) {
	path := filepath.Join(r.procRoot(), "meminfo")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	mi, err := ParseMeminfo(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mi, nil
}

func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := ParseUint(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

func readStatKey(path, key string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	stat, err := ParseMemoryStat(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	v, ok := stat[key]
	if !ok {
		return 0, fmt.Errorf("%s: no %s", path, key)
	}
	return v, nil
}

// PIDs reads pid.available the way kubelet does: the limit is the smaller of kernel.pid_max and
// kernel.threads-max (threads-max is ignored when absent), the count is the task total from
// /proc/loadavg, and available = limit - count, floored at 0.
func (r Reader) PIDs() (available, limit int64, err error) {
	limit, err = r.pidLimit()
	if err != nil {
		return 0, 0, err
	}
	path := filepath.Join(r.procRoot(), "loadavg")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	tasks, err := ParseLoadavgTasks(data)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	return max(limit-tasks, 0), limit, nil
}

func (r Reader) pidLimit() (int64, error) {
	pidMax, err := readUint(filepath.Join(r.procRoot(), "sys", "kernel", "pid_max"))
	if err != nil {
		return 0, err
	}
	limit := pidMax
	threadsMax, err := readUint(filepath.Join(r.procRoot(), "sys", "kernel", "threads-max"))
	switch {
	case err == nil:
		limit = min(limit, threadsMax)
	case !errors.Is(err, fs.ErrNotExist):
		return 0, err
	}
	return clamp(limit), nil
}

// Read returns every signal the Reader knows, sorted by name: memory.available, pid.available,
// when FS.NodeFS is set the nodefs, imagefs and containerfs signals, and the PSI signals where the
// kernel has /proc/pressure.
func (r Reader) Read() ([]*agentv1.Signal, error) {
	m, err := r.Memory()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MemoryAvailable, err)
	}
	pids, limit, err := r.PIDs()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", PIDAvailable, err)
	}
	out := []*agentv1.Signal{
		{Name: MemoryAvailable, Available: m.Available, Capacity: m.Capacity},
		{Name: PIDAvailable, Available: pids, Capacity: limit},
	}
	if len(r.PodsCgroups) > 0 {
		avail, capacity, ok, err := r.AllocatableMemory(r.PodsCgroups)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", AllocatableMemoryAvailable, err)
		}
		if ok {
			out = append(out, &agentv1.Signal{Name: AllocatableMemoryAvailable, Available: avail, Capacity: capacity})
		}
	}
	if r.FS.NodeFS != "" {
		node, image, container, _, err := r.FS.Disks()
		if err != nil {
			return nil, err
		}
		out = append(out, fsSignals(node, image, container)...)
	}
	psi, err := r.PSISignals()
	if err != nil {
		return nil, err
	}
	out = append(out, psi...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Capacity returns the node capacity for the agent's Hello: MemTotal, the CPUs this process may use
// in millicores, and kernel.pid_max.
func (r Reader) Capacity() (*agentv1.Capacity, error) {
	mi, err := r.meminfo()
	if err != nil {
		return nil, err
	}
	pidMax, err := readUint(filepath.Join(r.procRoot(), "sys", "kernel", "pid_max"))
	if err != nil {
		return nil, err
	}
	return &agentv1.Capacity{
		MemoryBytes: clamp(mi["MemTotal"]),
		CpuMillis:   int64(runtime.NumCPU()) * 1000,
		Pids:        clamp(pidMax),
	}, nil
}

// HostSampler adapts a Reader to the agent's Sampler interface.
type HostSampler struct {
	// Reader reads the signals.
	Reader Reader
	// Now stamps ObservedAt; nil means time.Now.
	Now func() time.Time
}

// Sample reads the signals once.
func (h HostSampler) Sample(ctx context.Context) (*agentv1.SignalSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	at := now()
	sigs, err := h.Reader.Read()
	if err != nil {
		return nil, err
	}
	return &agentv1.SignalSample{ObservedAt: timestamppb.New(at), Signals: sigs}, nil
}

// String describes the reader's configuration for logs.
func (r Reader) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "proc=%s cgroup=%s version=%v", r.procRoot(), r.cgroupRoot(), r.CgroupVersion)
	if r.CgroupPath != "" {
		fmt.Fprintf(&b, " path=%s", r.CgroupPath)
	}
	return b.String()
}

// AllocatableMemoryAvailable is kubelet's allocatableMemory.available signal.
const AllocatableMemoryAvailable = "allocatableMemory.available"

// DefaultPodsCgroups are where the kubelet puts the pods' cgroup (its "allocatable" cgroup): the
// systemd driver's kubepods.slice, then the cgroupfs driver's kubepods.
var DefaultPodsCgroups = []string{"kubepods.slice", "kubepods"}

// Allocatable is AllocatableMemory of PodsCgroups (ok false when none is set).
func (r Reader) Allocatable() (available, capacity int64, ok bool, err error) {
	if len(r.PodsCgroups) == 0 {
		return 0, 0, false, nil
	}
	return r.AllocatableMemory(r.PodsCgroups)
}

// AllocatableMemory reads allocatableMemory.available as kubelet does from the pods' cgroup (the
// first of cgroups that exists under the memory hierarchy): working set = usage - inactive_file,
// available = the cgroup's memory limit - working set (floored at 0), capacity = available +
// working set. ok is false when no such cgroup exists or its memory is unlimited (kubelet then has
// no observation either).
func (r Reader) AllocatableMemory(cgroups []string) (available, capacity int64, ok bool, err error) {
	version, dir, err := r.Detect()
	if err != nil {
		return 0, 0, false, err
	}
	for _, c := range cgroups {
		cg := filepath.Join(dir, filepath.Clean("/"+c))
		if cg == filepath.Clean(dir) || !exists(cg) {
			continue
		}
		var usage, inactive, limit uint64
		if version == CgroupV1 {
			if usage, err = readUint(filepath.Join(cg, "memory.usage_in_bytes")); err != nil {
				return 0, 0, false, err
			}
			if inactive, err = readStatKey(filepath.Join(cg, "memory.stat"), "total_inactive_file"); err != nil {
				return 0, 0, false, err
			}
			if limit, err = readUint(filepath.Join(cg, "memory.limit_in_bytes")); err != nil {
				return 0, 0, false, err
			}
		} else {
			if usage, err = readUint(filepath.Join(cg, "memory.current")); err != nil {
				return 0, 0, false, err
			}
			if inactive, err = readStatKey(filepath.Join(cg, "memory.stat"), "inactive_file"); err != nil {
				return 0, 0, false, err
			}
			data, err := os.ReadFile(filepath.Join(cg, "memory.max"))
			if err != nil {
				return 0, 0, false, err
			}
			if strings.TrimSpace(string(data)) == "max" {
				return 0, 0, false, nil
			}
			if limit, err = ParseUint(data); err != nil {
				return 0, 0, false, fmt.Errorf("%s: %w", filepath.Join(cg, "memory.max"), err)
			}
		}
		// cgroup v1 writes a page-rounded math.MaxInt64 for "no limit" (cadvisor's unlimited).
		if limit >= 1<<62 {
			return 0, 0, false, nil
		}
		ws := uint64(0)
		if usage > inactive {
			ws = usage - inactive
		}
		avail := uint64(0)
		if limit > ws {
			avail = limit - ws
		}
		return clamp(avail), clamp(avail + ws), true, nil
	}
	return 0, 0, false, nil
}

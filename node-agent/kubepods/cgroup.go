package kubepods

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/signals"
)

// CgroupDriver is the kubelet's --cgroup-driver: how pod cgroups are named.
type CgroupDriver int

// The cgroup drivers. CgroupDriverAuto picks the one whose kubepods cgroup exists.
const (
	CgroupDriverAuto CgroupDriver = iota
	CgroupDriverCgroupfs
	CgroupDriverSystemd
)

// ParseCgroupDriver parses "auto", "cgroupfs" or "systemd".
func ParseCgroupDriver(s string) (CgroupDriver, error) {
	switch s {
	case "auto", "":
		return CgroupDriverAuto, nil
	case "cgroupfs":
		return CgroupDriverCgroupfs, nil
	case "systemd":
		return CgroupDriverSystemd, nil
	}
	return 0, fmt.Errorf("cgroup driver %q: want auto, cgroupfs or systemd", s)
}

func (d CgroupDriver) String() string {
	switch d {
	case CgroupDriverAuto:
		return "auto"
	case CgroupDriverCgroupfs:
		return "cgroupfs"
	case CgroupDriverSystemd:
		return "systemd"
	}
	return fmt.Sprintf("CgroupDriver(%d)", int(d))
}

// PodCgroup returns a pod's cgroup relative to the hierarchy's root, as the kubelet names it
// (with its default --cgroup-root=/ and --cgroups-per-qos):
//
//	cgroupfs: kubepods/pod<uid>, kubepods/burstable/pod<uid>, kubepods/besteffort/pod<uid>
//	systemd:  kubepods.slice/kubepods-pod<uid>.slice,
//	          kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice, ...
//
// for Guaranteed, Burstable and BestEffort pods; systemd slices spell the uid's dashes as
// underscores. CgroupDriverAuto is taken as cgroupfs.
func PodCgroup(d CgroupDriver, qos eviction.QoSClass, uid string) string {
	tier := ""
	switch qos {
	case eviction.Burstable:
		tier = "burstable"
	case eviction.BestEffort:
		tier = "besteffort"
	}
	if d != CgroupDriverSystemd {
		return filepath.Join("kubepods", tier, "pod"+uid)
	}
	slice := "kubepods"
	dir := "kubepods.slice"
	if tier != "" {
		slice += "-" + tier
		dir = filepath.Join(dir, slice+".slice")
	}
	return filepath.Join(dir, slice+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")
}

// Usage is what a pod's cgroup tells about it.
type Usage struct {
	// MemoryWorkingSet is usage - inactive file cache, floored at 0: what kubelet ranks on.
	MemoryWorkingSet int64
	// Processes is the pod's pids.current (0 when the pids controller is not there).
	Processes int64
	// Dir is the memory cgroup directory read.
	Dir string
}

// Cgroups finds and reads pods' cgroups.
type Cgroups struct {
	// Root is where the cgroup filesystems are mounted (default /sys/fs/cgroup).
	Root string
	// Version is the hierarchy the memory controller is read from; CgroupAuto detects it as
	// signals.Reader does.
	Version signals.CgroupVersion
	// Driver is the kubelet's cgroup driver; CgroupDriverAuto looks for kubepods.slice, then kubepods.
	Driver CgroupDriver
	// KubeletRoot is the kubelet's --cgroup-root, relative to the hierarchy's root (default /):
	// the pods' cgroups are under it.
	KubeletRoot string
}

// hierarchies returns the memory hierarchy's directory and the pids hierarchy's, with the version.
func (c Cgroups) hierarchies() (memory, pids string, v signals.CgroupVersion, err error) {
	root := c.Root
	if root == "" {
		root = signals.DefaultCgroupRoot
	}
	v, memory, err = signals.Reader{CgroupRoot: root, CgroupVersion: c.Version}.Detect()
	if err != nil {
		return "", "", 0, err
	}
	if v == signals.CgroupV1 {
		return memory, filepath.Join(root, "pids"), v, nil
	}
	return memory, memory, v, nil
}

// driver resolves CgroupDriverAuto in the memory hierarchy dir.
func (c Cgroups) driver(dir string) CgroupDriver {
	if c.Driver != CgroupDriverAuto {
		return c.Driver
	}
	if _, err := os.Stat(filepath.Join(dir, c.KubeletRoot, "kubepods.slice")); err == nil {
		return CgroupDriverSystemd
	}
	return CgroupDriverCgroupfs
}

// Read returns the usage of the pod with this QoS class and uid. ok is false, with no error, when
// the pod has no cgroup (not started, or not on this node's runtime): its usage is unknown.
//
// cgroup v1: memory.usage_in_bytes minus memory.stat total_inactive_file; v2: memory.current
// minus memory.stat inactive_file.
func (c Cgroups) Read(qos eviction.QoSClass, uid string) (u Usage, ok bool, err error) {
	memDir, pidsDir, v, err := c.hierarchies()
	if err != nil {
		return Usage{}, false, err
	}
	rel := filepath.Join("/", c.KubeletRoot, PodCgroup(c.driver(memDir), qos, uid))
	dir := filepath.Join(memDir, rel)
	usageFile, inactiveKey := "memory.current", "inactive_file"
	if v == signals.CgroupV1 {
		usageFile, inactiveKey = "memory.usage_in_bytes", "total_inactive_file"
	}
	usage, err := readUint(filepath.Join(dir, usageFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Usage{}, false, nil
	}
	if err != nil {
		return Usage{}, false, err
	}
	stat, err := readStat(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return Usage{}, false, err
	}
	inactive, found := stat[inactiveKey]
	if !found {
		return Usage{}, false, fmt.Errorf("%s: no %s", filepath.Join(dir, "memory.stat"), inactiveKey)
	}
	u = Usage{Dir: dir, MemoryWorkingSet: signals.ComputeMemory(0, usage, inactive).WorkingSet}
	if n, err := readUint(filepath.Join(pidsDir, rel, "pids.current")); err == nil {
		u.Processes = int64(min(n, 1<<62))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Usage{}, false, err
	}
	return u, true, nil
}

func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := signals.ParseUint(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

func readStat(path string) (map[string]uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	stat, err := signals.ParseMemoryStat(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return stat, nil
}

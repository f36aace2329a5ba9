package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// mount is one line of /proc/self/mountinfo: where and what.
type mount struct {
	Point, FSType string
}

// parseMountinfo reads the mount point and filesystem type of every well-formed line of a
// mountinfo file (proc(5)); octal escapes such as \040 in paths are decoded.
func parseMountinfo(data string) []mount {
	var out []mount
	for _, line := range strings.Split(data, "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, v := range f {
			if v == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 6 || sep+1 >= len(f) {
			continue
		}
		out = append(out, mount{Point: unescapeOctal(f[4]), FSType: f[sep+1]})
	}
	return out
}

// unescapeOctal decodes the \NNN escapes the kernel writes for space, tab, newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder returns the mount points at or below dir, deepest first (the order to unmount).
func mountsUnder(ms []mount, dir string) []string {
	dir = filepath.Clean(dir)
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		p := filepath.Clean(m.Point)
		if (p == dir || strings.HasPrefix(p, dir+"/")) && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if di, dj := strings.Count(out[i], "/"), strings.Count(out[j], "/"); di != dj {
			return di > dj
		}
		return out[i] > out[j]
	})
	return out
}

// cgroupV1Hierarchies returns the mount points of the cgroup v1 hierarchies, sorted.
func cgroupV1Hierarchies(ms []mount) []string { return cgroupMounts(ms, false) }

// cgroupMounts returns the mount points of the cgroup v1 hierarchies, and with v2 of the cgroup
// v2 ones too (runc also joins the unified hierarchy of a hybrid machine), sorted.
func cgroupMounts(ms []mount, v2 bool) []string {
	var out []string
	for _, m := range ms {
		if m.FSType == "cgroup" || (v2 && m.FSType == "cgroup2") {
			out = append(out, m.Point)
		}
	}
	sort.Strings(out)
	return out
}

func readMounts() ([]mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(string(data)), nil
}

// unmountUnder lazily unmounts everything mounted at or below dir, deepest first; it returns the
// first failure.
func unmountUnder(dir string) error {
	var first error
	for round := 0; round < 5; round++ {
		ms, err := readMounts()
		if err != nil {
			return err
		}
		points := mountsUnder(ms, dir)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) && first == nil {
				first = fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	return first
}

// cgroupPIDs returns every process in the cgroup tree named root (such as "/nf-node-1") of every
// hierarchy, sorted and without duplicates.
func cgroupPIDs(root string) []int {
	ms, _ := readMounts()
	seen := map[int]bool{}
	for _, h := range cgroupMounts(ms, true) {
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	sort.Ints(pids)
	return pids
}

// makeCgroupRoot creates root in every v1 hierarchy (kubelet requires it), with the cpuset
// hierarchy's cpus and mems copied from the top (a new cpuset is empty and admits no process).
func makeCgroupRoot(root string) error {
	ms, err := readMounts()
	if err != nil {
		return err
	}
	for _, h := range cgroupV1Hierarchies(ms) {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
			}
		}
	}
	return nil
}

// removeCgroupRoot removes the (empty) cgroup tree root from every v1 hierarchy, deepest first.
func removeCgroupRoot(root string) {
	ms, _ := readMounts()
	for _, h := range cgroupMounts(ms, true) {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

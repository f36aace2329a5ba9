package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// kubeletSysctls are the machine-wide settings kubelet rewrites at start (vm.overcommit_memory=1,
// kernel.panic=10, kernel.panic_on_oops=1). Up saves them and Down restores them.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// runDir holds the machine-wide files of a cluster prefix: lock, saved sysctls, last state.
const runDir = "/run"

func lockPath(prefix string) string {
	return filepath.Join(runDir, "nodefence-cluster-"+prefix+".lock")
}
func sysctlPath(prefix string) string {
	return filepath.Join(runDir, "nodefence-cluster-"+prefix+".sysctl")
}
func statePath(prefix string) string {
	return filepath.Join(runDir, "nodefence-cluster-"+prefix+".dir")
}

// saveSysctls records the current values unless a file from an earlier cluster that was never
// torn down holds them already (those are the machine's own values; the current ones may be
// kubelet's).
// It returns the saved values, key (such as "kernel/panic") to value.
func saveSysctls(prefix string) (map[string]string, error) {
	p := sysctlPath(prefix)
	if data, err := os.ReadFile(p); err == nil {
		saved := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && known(k) {
				saved[k] = v
			}
		}
		return saved, nil
	}
	saved := map[string]string{}
	var b strings.Builder
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return nil, err
		}
		saved[k] = strings.TrimSpace(string(v))
		fmt.Fprintf(&b, "%s=%s\n", k, saved[k])
	}
	return saved, writeFileAtomic(p, []byte(b.String()))
}

// restoreSysctls writes the saved values back and removes the file.
func restoreSysctls(prefix string) error {
	p := sysctlPath(prefix)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !known(k) {
			errs = append(errs, fmt.Errorf("%s: bad line %q", p, line))
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v+"\n"), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, os.Remove(p))
	}
	return errors.Join(errs...)
}

func known(k string) bool {
	for _, s := range kubeletSysctls {
		if s == k {
			return true
		}
	}
	return false
}

// lockMachine takes the machine-wide lock of the prefix, waiting up to wait: two clusters with
// one prefix would fight over the bridge, the namespaces and the sysctls.
func lockMachine(prefix string, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(lockPath(prefix), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		if time.Now().After(deadline) {
			f.Close()
			owner, _ := os.ReadFile(statePath(prefix))
			return nil, fmt.Errorf("another testbed cluster with prefix %q holds %s (its directory: %s); stop it first (make cluster-down): %w",
				prefix, lockPath(prefix), strings.TrimSpace(string(owner)), errTimeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

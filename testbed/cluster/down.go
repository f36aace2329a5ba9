package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Down stops everything (nodes, control plane, BMCs), unmounts what the nodes mounted, removes
// the namespaces, the bridge and the cgroup roots, restores kubelet's sysctls and releases the
// lock. It is safe to call more than once.
func (c *Cluster) Down() error {
	c.downOnce.Do(func() {
		c.stopped.Store(true) // no BMC boots a node from now on
		close(c.stopPower)
		c.powerWG.Wait()
		for _, n := range c.Nodes {
			n.StopWatchdog() // nor does a watchdog reset one
		}
		var errs []error
		for _, n := range c.Nodes {
			n.mu.Lock()
			if _, err := n.killAll(); err != nil {
				errs = append(errs, err)
			}
			n.mu.Unlock()
		}
		for _, p := range []*proc{c.scheduler, c.kcm, c.apiserver, c.etcd} {
			p.stop(10 * time.Second)
		}
		for _, n := range c.Nodes {
			if n.BMC != nil {
				if err := n.BMC.Stop(); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := unmountUnder(c.Config.Dir); err != nil {
			errs = append(errs, err)
		}
		netDown(c.layout, c.Nodes)
		for _, n := range c.Nodes {
			removeCgroupRoot(n.CgroupRoot)
		}
		if err := restoreSysctls(c.Config.Prefix); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(statePath(c.Config.Prefix))
		if c.lock != nil {
			c.lock.Close()
		}
		c.downErr = errors.Join(errs...)
	})
	return c.downErr
}

// Leftovers lists what of the cluster remains on the machine: processes of its nodes, mounts
// under Dir, network namespaces, the bridge, cgroup roots, and kubelet's sysctls when they differ
// from the machine's values. After Down it must be empty.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, n := range c.Nodes {
		if _, err := os.Stat(netnsPath(n.Netns)); err == nil {
			out = append(out, "network namespace "+n.Netns)
		}
		if pids := cgroupPIDs(n.CgroupRoot); len(pids) > 0 {
			out = append(out, fmt.Sprintf("processes %v in cgroup %s", pids, n.CgroupRoot))
		}
		ms, _ := readMounts()
		for _, h := range cgroupMounts(ms, true) {
			if _, err := os.Stat(filepath.Join(h, n.CgroupRoot)); err == nil {
				out = append(out, "cgroup "+filepath.Join(h, n.CgroupRoot))
			}
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", c.layout.Bridge)); err == nil {
		out = append(out, "bridge "+c.layout.Bridge)
	}
	ms, _ := readMounts()
	for _, m := range mountsUnder(ms, c.Config.Dir) {
		out = append(out, "mount "+m)
	}
	for _, p := range []*proc{c.etcd, c.apiserver, c.kcm, c.scheduler} {
		if p != nil && !p.exited() {
			out = append(out, "process "+p.name)
		}
	}
	for k, want := range c.sysctls {
		if got, err := os.ReadFile(filepath.Join("/proc/sys", k)); err != nil || strings.TrimSpace(string(got)) != want {
			out = append(out, fmt.Sprintf("sysctl %s = %q, the machine's value is %q", k, strings.TrimSpace(string(got)), want))
		}
	}
	sort.Strings(out)
	return out
}

// sweep removes what a cluster of prefix left behind when its process died without Down: the
// processes of its namespaces and cgroup roots, its mounts, namespaces, bridge and cgroups, and
// restores the sysctls. The caller holds the prefix's lock.
func sweep(prefix string, nodes int, log *slog.Logger) {
	l := newLayout(Config{Prefix: prefix})
	var stale []*Node
	for i := 1; i <= nodes; i++ {
		n := &Node{Netns: prefix + "-node-" + strconv.Itoa(i), Veth: prefix + "v" + strconv.Itoa(i), CgroupRoot: "/" + prefix + "-node-" + strconv.Itoa(i)}
		n.IP, n.PodCIDR = nodeAddrs(l, i)
		stale = append(stale, n)
		pids, _ := netnsPIDs(netnsPath(n.Netns))
		pids = append(pids, cgroupPIDs(n.CgroupRoot)...)
		for _, pid := range pids {
			_ = syscallKill(pid)
		}
		if len(pids) > 0 {
			log.Warn("killed processes of a cluster left behind", "netns", n.Netns, "pids", pids)
		}
	}
	if dir, err := os.ReadFile(statePath(prefix)); err == nil {
		if d := strings.TrimSpace(string(dir)); filepath.IsAbs(d) && d != "/" {
			_ = unmountUnder(d)
		}
	}
	netDown(l, stale)
	for _, n := range stale {
		removeCgroupRoot(n.CgroupRoot)
	}
	_ = restoreSysctls(prefix)
}

// Sweep is sweep for a cluster whose process is gone (`make cluster-down` after a crash). It
// takes the prefix's lock, waiting up to wait.
func Sweep(prefix string, wait time.Duration, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	lock, err := lockMachine(prefix, wait)
	if err != nil {
		return err
	}
	defer lock.Close()
	sweep(prefix, MaxNodes, log)
	_ = os.Remove(statePath(prefix))
	return nil
}

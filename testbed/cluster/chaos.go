package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The faults of the no-fence scenarios (testbed/clustere2e's nofence_test.go): a stalled
// apiserver, a node's apiserver traffic through a proxy, a node's processes starved of CPU. Each
// has its undo; a node that dies or a cluster torn down takes what is left with it (the rules
// live in the node's network namespace, the starving cgroup under its cgroup root).

// SignalAPIServer sends sig to kube-apiserver (SIGSTOP stalls it, SIGCONT resumes it).
func (c *Cluster) SignalAPIServer(sig syscall.Signal) error {
	if c.apiserver == nil || c.apiserver.exited() {
		return errors.New("kube-apiserver is not running")
	}
	return c.apiserver.cmd.Process.Signal(sig)
}

// APIServerAddr is the apiserver's address on the bridge, as its certificate names it.
func (c *Cluster) APIServerAddr() netip.AddrPort {
	return netip.AddrPortFrom(c.layout.APIServerIP, 6443)
}

// KubeletPID is the process id of the node's kubelet, or 0.
func (n *Node) KubeletPID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet == nil || n.kubelet.exited() {
		return 0
	}
	return n.kubelet.pid()
}

// RedirectAPIServer sends every new connection the node opens to the apiserver to addr instead
// (a DNAT rule in the node's network namespace; TLS still names the apiserver) and resets the open
// ones, so that kubelet and the agent reconnect through addr. UnredirectAPIServer undoes it.
func (n *Node) RedirectAPIServer(addr netip.AddrPort) error {
	if err := n.inNetns("iptables", append([]string{"-t", "nat", "-A"}, n.redirectRule(addr)...)...); err != nil {
		return err
	}
	return n.resetAPIServerConns()
}

// UnredirectAPIServer removes RedirectAPIServer's rule (no error if there is none) and resets the
// node's connections to the apiserver, so that they reconnect directly.
func (n *Node) UnredirectAPIServer(addr netip.AddrPort) error {
	for range 4 { // at most as many rules as redirections; one normally
		if n.inNetns("iptables", append([]string{"-t", "nat", "-D"}, n.redirectRule(addr)...)...) != nil {
			break
		}
	}
	return n.resetAPIServerConns()
}

func (n *Node) redirectRule(addr netip.AddrPort) []string {
	api := n.c.APIServerAddr()
	return []string{"OUTPUT", "-p", "tcp", "-d", api.Addr().String(), "--dport", strconv.Itoa(int(api.Port())),
		"-j", "DNAT", "--to-destination", addr.String()}
}

// resetAPIServerConns kills the node's TCP connections to the apiserver (ss -K): their peers see
// a reset and reconnect.
func (n *Node) resetAPIServerConns() error {
	api := n.c.APIServerAddr()
	return n.inNetns("ss", "-K", "dst", api.Addr().String(), "dport", "=", strconv.Itoa(int(api.Port())))
}

// inNetns runs a program in the node's network namespace.
func (n *Node) inNetns(prog string, args ...string) error {
	argv := append(append(n.nsenter(), prog), args...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w: %s", n.Name, prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// starveCgroup is the cpu cgroup StarveCPU moves processes into, under the node's cgroup root.
const starveCgroup = "nodefence-starve"

// StarveCPU moves the processes pids (with all their threads) into a cpu cgroup under the node's
// cgroup root whose CFS quota is permille thousandths of one CPU (10: 1%), and returns the undo:
// the processes back to the cgroup each was in, the cgroup removed; it returns the cgroup's
// throttling counters (cpu.stat) first, which prove the quota bit.
func (n *Node) StarveCPU(permille int, pids ...int) (restore func() (stat string, err error), err error) {
	if permille < 1 || permille > 1000 {
		return nil, fmt.Errorf("%s: StarveCPU: permille must be 1..1000, got %d", n.Name, permille)
	}
	h, err := cpuHierarchy()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(h, n.CgroupRoot, starveCgroup)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	period := 100000 // µs: 1% is 1 ms every 100 ms
	if permille < 10 {
		period = 1000000 // the quota's minimum is 1 ms: 0.1% is 1 ms a second
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(period*permille/1000)), 0o644); err != nil {
		return nil, err
	}
	from := map[int]string{}
	restore = func() (string, error) {
		stat, _ := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		var errs []error
		for pid, cg := range from {
			err := os.WriteFile(filepath.Join(h, cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
			if err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("%s: move %d back to %s: %w", n.Name, pid, cg, err))
			}
		}
		if err := removeCgroup(h, dir, from); err != nil {
			errs = append(errs, fmt.Errorf("%s: remove %s: %w", n.Name, dir, err))
		}
		return strings.Join(strings.Fields(string(stat)), " "), errors.Join(errs...)
	}
	for _, pid := range pids {
		cg, err := cpuCgroupOf(pid)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		}
		if err != nil {
			_, rerr := restore()
			return nil, errors.Join(fmt.Errorf("%s: starve %d: %w", n.Name, pid, err), rerr)
		}
		from[pid] = cg
	}
	return restore, nil
}

// removeCgroup removes the starvation cgroup dir of hierarchy h. Processes the starved ones started
// meanwhile (a kubelet's helpers) inherited it: they go back to the cgroup of the starved process
// with the lowest pid, and the removal is tried again while the cgroup is busy (an exiting process
// leaves it a moment later), for up to 2 s.
func removeCgroup(h, dir string, from map[int]string) error {
	back, first := "", 0
	for pid, cg := range from {
		if first == 0 || pid < first {
			back, first = cg, pid
		}
	}
	var err error
	for range 20 {
		if back != "" {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, pid := range strings.Fields(string(procs)) {
				_ = os.WriteFile(filepath.Join(h, back, "cgroup.procs"), []byte(pid), 0o644)
			}
		}
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// cpuHierarchy is the mount point of the cgroup v1 hierarchy with the cpu controller.
func cpuHierarchy() (string, error) {
	ms, err := readMounts()
	if err != nil {
		return "", err
	}
	for _, h := range cgroupV1Hierarchies(ms) {
		if _, err := os.Stat(filepath.Join(h, "cpu.cfs_quota_us")); err == nil {
			return h, nil
		}
	}
	return "", errors.New("no cgroup v1 hierarchy with the cpu controller")
}

// cpuCgroupOf is the cpu-controller cgroup path of process pid (/proc/PID/cgroup).
func cpuCgroupOf(pid int) (string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if ctl == "cpu" {
				return f[2], nil
			}
		}
	}
	return "", fmt.Errorf("process %d: no cpu cgroup", pid)
}

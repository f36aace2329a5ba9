package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/procs"
	"github.com/nodefence/nodefence/testbed/watchdogsim"
)

// Node is one Kubernetes node: a network namespace with its own containerd, runc state and
// kubelet, a cgroup root, and a BMC that really powers it.
type Node struct {
	// Name is the Kubernetes node name, node-<i>.
	Name string
	// Netns is the network namespace (/run/netns/<Netns>); Veth the host end of its link.
	Netns, Veth string
	// IP is the node's address on the bridge; PodCIDR its pods' addresses.
	IP      netip.Addr
	PodCIDR netip.Prefix
	// CgroupRoot is kubelet's cgroupRoot, present in every cgroup v1 hierarchy.
	CgroupRoot string
	// Dir holds the node's configuration, state and logs.
	Dir string
	// Zone is the node's topology.kubernetes.io/zone.
	Zone string
	// BMC is the node's ipmi_sim BMC: chassis power off kills every process of the node, power on
	// boots it.
	BMC *ipmisim.BMC

	c *Cluster

	mu         sync.Mutex
	running    bool // processes started and not killed
	containerd *proc
	kubelet    *proc
	services   []Service
	svcProcs   map[string]*proc
	restarts   int
	bootErr    error
	// kubeletHeld: KillKubelet stopped the kubelet; watchKubelet leaves it stopped.
	kubeletHeld bool
	// wd is the node's watchdog device (StartWatchdog), or nil; wdReset is set when it fired and
	// its reset has not run, and cleared when the node loses power first (watchdog.go).
	wd      *watchdogsim.Device
	wdReset atomic.Bool
}

// Service is a program that runs on a node, started in its network namespace each time the node
// boots (after kubelet) and killed with it, like a systemd unit.
type Service struct {
	// Name names the service and its log file, <node dir>/log/<Name>.log.
	Name string
	// Bin and Args are the program and its arguments; Env is added to the environment.
	Bin  string
	Args []string
	Env  []string
}

// maxKubeletRestarts bounds how often the watchdog restarts a kubelet that exited (all kubelets
// share /var/lib/kubelet/device-plugins/kubelet.sock; one starting next to another may lose it).
const maxKubeletRestarts = 5

func (n *Node) logPath(name string) string { return filepath.Join(n.Dir, "log", name+".log") }

// ServiceLog is the log file of the node's service name (its output across restarts and boots).
func (n *Node) ServiceLog(name string) string { return n.logPath(name) }

// BootIDFile is the node's boot id, a new one every boot (node agents read it).
func (n *Node) BootIDFile() string { return filepath.Join(n.Dir, "boot_id") }

func (n *Node) nsenter() []string { return []string{"nsenter", "--net=" + netnsPath(n.Netns)} }

// Running reports whether the node's processes were started and not killed since.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running
}

// boot starts containerd (importing the images when missing), kubelet and the services. The
// caller holds n.mu.
func (n *Node) boot() error {
	if n.running {
		return nil
	}
	if err := n.newBootID(); err != nil {
		return err
	}
	n.running = true
	n.kubeletHeld = false
	if err := n.startContainerd(); err != nil {
		return err
	}
	if err := n.waitContainerd(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	if err := n.importImages(); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	for _, s := range n.services {
		if err := n.startService(s); err != nil {
			return err
		}
	}
	return nil
}

// newBootID writes a new random boot id (a UUID) to BootIDFile.
func (n *Node) newBootID() error {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	h := hex.EncodeToString(id)
	return os.WriteFile(n.BootIDFile(), []byte(h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:]+"\n"), 0o644)
}

func (n *Node) startContainerd() error {
	p, err := spawn(n.Name+" containerd", n.logPath("containerd"), nil, n.nsenter(),
		"containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))
	n.containerd = p
	return err
}

func (n *Node) ctr(args ...string) ([]byte, error) {
	return exec.Command("ctr", append([]string{"-a", filepath.Join(n.Dir, "containerd.sock"), "-n", "k8s.io"}, args...)...).CombinedOutput()
}

func (n *Node) waitContainerd(deadline time.Time) error {
	return poll(deadline, 100*time.Millisecond, func() (bool, error) {
		if n.containerd.exited() {
			return false, n.containerd.failure("exited at start")
		}
		_, err := n.ctr("version")
		return err == nil, nil
	}, func() error { return n.containerd.failure("socket not answering: " + errTimeout.Error()) })
}

func (n *Node) importImages() error {
	out, err := n.ctr("images", "ls", "-q")
	if err != nil {
		return fmt.Errorf("%s: ctr images ls: %w: %s", n.Name, err, out)
	}
	have := string(out)
	for img, tarPath := range map[string]string{PauseImage: n.c.pauseTar, BusyboxImage: n.c.busyboxTar} {
		if strings.Contains(have, img) {
			continue
		}
		if out, err := n.ctr("images", "import", tarPath); err != nil {
			return fmt.Errorf("%s: ctr images import %s: %w: %s", n.Name, tarPath, err, out)
		}
	}
	return nil
}

func (n *Node) startKubelet() error {
	c := n.c
	p, err := spawn(n.Name+" kubelet", n.logPath("kubelet"), nil, n.nsenter(), c.bin(kubeletBin),
		"--config="+filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(c.Config.Dir, "kubelet-"+n.Name+".kubeconfig"),
		"--root-dir="+filepath.Join(n.Dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.Dir, "kubelet", "pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP.String(),
		"--node-labels=topology.kubernetes.io/zone="+n.Zone+",topology.kubernetes.io/region="+c.Config.Region,
		"--v=1")
	n.kubelet = p
	return err
}

func (n *Node) startService(s Service) error {
	p, err := spawn(n.Name+" "+s.Name, n.logPath(s.Name), s.Env, n.nsenter(), s.Bin, s.Args...)
	if err != nil {
		return err
	}
	if n.svcProcs == nil {
		n.svcProcs = map[string]*proc{}
	}
	n.svcProcs[s.Name] = p
	return nil
}

// AddService registers s to run on the node at every boot, and starts it now if the node runs.
func (n *Node) AddService(s Service) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range n.services {
		if o.Name == s.Name {
			return fmt.Errorf("%s: service %q exists", n.Name, s.Name)
		}
	}
	n.services = append(n.services, s)
	if n.running {
		return n.startService(s)
	}
	return nil
}

// RemoveService stops the service (SIGTERM, then SIGKILL after 5 s) and forgets it.
func (n *Node) RemoveService(name string) {
	n.mu.Lock()
	p := n.svcProcs[name]
	delete(n.svcProcs, name)
	for i, s := range n.services {
		if s.Name == name {
			n.services = append(n.services[:i], n.services[i+1:]...)
			break
		}
	}
	n.mu.Unlock()
	p.stop(5 * time.Second)
}

// ServicePID is the process id of a running service, or 0.
func (n *Node) ServicePID(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.svcProcs[name]; p != nil && !p.exited() {
		return p.pid()
	}
	return 0
}

// killAll SIGKILLs every process in the node's network namespace and cgroup tree (kubelet,
// containerd, shims, containers, services) until none is left, and reaps the ones it started.
// The caller holds n.mu. It returns how many processes it killed.
func (n *Node) killAll() (int, error) {
	n.running = false
	killed := map[int]bool{}
	for round := 0; ; round++ {
		pids, err := netnsPIDs(netnsPath(n.Netns))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return len(killed), err
		}
		pids = append(pids, cgroupPIDs(n.CgroupRoot)...)
		if len(pids) == 0 {
			break
		}
		if round == 50 {
			return len(killed), fmt.Errorf("%s: processes %v survive SIGKILL", n.Name, pids)
		}
		for _, pid := range pids {
			if pid == os.Getpid() {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed[pid] = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range append([]*proc{n.containerd, n.kubelet}, mapValues(n.svcProcs)...) {
		if p != nil {
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				return len(killed), p.failure("not reaped 5 s after SIGKILL")
			}
		}
	}
	n.containerd, n.kubelet, n.svcProcs = nil, nil, nil
	return len(killed), nil
}

func mapValues(m map[string]*proc) []*proc {
	out := make([]*proc, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	return out
}

// Crash kills every process of the node with SIGKILL, as a kernel panic or a hang would stop it:
// the BMC still says the power is on, and an armed watchdog (StartWatchdog) resets the node after
// its timeout.
func (n *Node) Crash() (killed int, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killAll()
}

// powerOff is the BMC's power-off: the node's processes die, then the BMC reads off. The node's
// watchdog loses power with it.
func (n *Node) powerOff() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.powerOffLocked()
}

// powerOffLocked is powerOff; the caller holds n.mu.
func (n *Node) powerOffLocked() error {
	killed, err := n.killAll()
	if err == nil {
		n.watchdogPowerLoss()
	}
	n.c.log.Info("power off", "node", n.Name, "killed", killed, "err", err)
	return err
}

// powerOn boots the node unless it runs; errors are kept for BootError and logged.
func (n *Node) powerOn() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.powerOnLocked()
}

// powerOnLocked is powerOn; the caller holds n.mu.
func (n *Node) powerOnLocked() {
	if n.running || n.c.stopped.Load() {
		return
	}
	err := n.boot()
	n.bootErr = err
	n.c.log.Info("power on", "node", n.Name, "err", err)
}

// BootError is the error of the node's last boot by its BMC, if any.
func (n *Node) BootError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bootErr
}

// Partition cuts the node's link to the bridge: it keeps running (and writing to shared
// storage), but reaches neither the apiserver nor anything on the host, and nothing reaches it.
// Its BMC stays reachable: it is out of band.
func (n *Node) Partition() error { return ip("link", "set", n.Veth, "down") }

// Heal restores the node's link.
func (n *Node) Heal() error { return ip("link", "set", n.Veth, "up") }

// Blackhole drops, inside the node, every packet to addr (such as a coordinator's address),
// while the rest of the node's traffic flows. Unblackhole removes the route.
func (n *Node) Blackhole(addr netip.Addr) error {
	return ip("-n", n.Netns, "route", "replace", "blackhole", addr.String()+"/32")
}

// Unblackhole removes a route Blackhole added.
func (n *Node) Unblackhole(addr netip.Addr) error {
	return ip("-n", n.Netns, "route", "del", "blackhole", addr.String()+"/32")
}

// watchKubelet restarts the kubelet if it exited while the node runs (at most
// maxKubeletRestarts times). It returns an error with the kubelet's log when it gives up.
func (n *Node) watchKubelet(log *slog.Logger) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running || n.kubeletHeld || n.kubelet == nil || !n.kubelet.exited() {
		return nil
	}
	if n.restarts >= maxKubeletRestarts {
		return n.kubelet.failure(fmt.Sprintf("exited %d times", n.restarts+1))
	}
	n.restarts++
	log.Warn("kubelet exited; restarting it", "node", n.Name, "restart", n.restarts, "tail", procs.Tail(n.kubelet.log, 3))
	return n.startKubelet()
}

// KillService SIGKILLs the service's process, leaving the rest of the node running, and waits
// until it is reaped. StartService starts it again.
func (n *Node) KillService(name string) error {
	n.mu.Lock()
	p := n.svcProcs[name]
	n.mu.Unlock()
	if p == nil || p.exited() {
		return fmt.Errorf("%s: service %q is not running", n.Name, name)
	}
	return p.killWait()
}

// StartService starts a registered service whose process exited, on a running node.
func (n *Node) StartService(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running {
		return fmt.Errorf("%s: not running", n.Name)
	}
	if p := n.svcProcs[name]; p != nil && !p.exited() {
		return fmt.Errorf("%s: service %q runs", n.Name, name)
	}
	for _, s := range n.services {
		if s.Name == name {
			return n.startService(s)
		}
	}
	return fmt.Errorf("%s: no service %q", n.Name, name)
}

// KillKubelet SIGKILLs the node's kubelet alone (containers and services keep running) and keeps
// the watchdog from restarting it until StartKubelet.
func (n *Node) KillKubelet() error {
	n.mu.Lock()
	p := n.kubelet
	if p == nil || p.exited() || !n.running {
		n.mu.Unlock()
		return fmt.Errorf("%s: kubelet is not running", n.Name)
	}
	n.kubeletHeld = true
	n.mu.Unlock()
	return p.killWait()
}

// StartKubelet starts the kubelet KillKubelet stopped.
func (n *Node) StartKubelet() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.kubeletHeld {
		return fmt.Errorf("%s: kubelet was not stopped by KillKubelet", n.Name)
	}
	n.kubeletHeld = false
	if !n.running {
		return nil
	}
	return n.startKubelet()
}

// StopService stops the service as a rolling update stops a pod (SIGTERM, SIGKILL after 5 s),
// leaving the rest of the node running. StartService starts it again.
func (n *Node) StopService(name string) error {
	n.mu.Lock()
	p := n.svcProcs[name]
	n.mu.Unlock()
	if p == nil || p.exited() {
		return fmt.Errorf("%s: service %q is not running", n.Name, name)
	}
	p.stop(5 * time.Second)
	return nil
}

// ReconfigureKubelet rewrites the node's KubeletConfiguration with fields (top-level key → YAML
// value, e.g. "evictionHard" → `{memory.available: "100Mi"}`) replacing its values or added, and
// restarts its kubelet when the node runs (containers keep running). The configuration stays for
// later boots.
func (n *Node) ReconfigureKubelet(fields map[string]string) error {
	path := filepath.Join(n.Dir, "kubelet.yaml")
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(withFields(string(doc), fields)), 0o644); err != nil {
		return err
	}
	n.mu.Lock()
	p, running := n.kubelet, n.running
	if running {
		n.kubeletHeld = true // the watchdog leaves it alone meanwhile
	}
	n.mu.Unlock()
	if !running {
		return nil
	}
	if p != nil && !p.exited() {
		if err := p.killWait(); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kubeletHeld = false
	if !n.running {
		return nil
	}
	return n.startKubelet()
}

// withFields replaces the top-level keys of a YAML document that fields name, and appends the
// others in key order.
func withFields(doc string, fields map[string]string) string {
	done := map[string]bool{}
	lines := strings.Split(strings.TrimSuffix(doc, "\n"), "\n")
	for i, l := range lines {
		k, _, ok := strings.Cut(l, ":")
		if v, set := fields[k]; ok && set && !strings.HasPrefix(l, " ") {
			lines[i], done[k] = k+": "+v, true
		}
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if !done[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		lines = append(lines, k+": "+fields[k])
	}
	return strings.Join(lines, "\n") + "\n"
}

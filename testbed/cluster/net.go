package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// ip runs the ip(8) command with args and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netnsPath is where `ip netns add` mounts the namespace NAME.
func netnsPath(name string) string { return filepath.Join("/run/netns", name) }

// netUp creates the bridge with the host addresses and one network namespace per node, attached
// to the bridge by a veth pair, with routes to every node's pod CIDR. Nothing gets a default
// route: from a node or a pod, only the bridge's subnet and the pod CIDRs are reachable.
func (c *Cluster) netUp() error {
	l := c.layout
	if err := ip("link", "add", l.Bridge, "type", "bridge"); err != nil {
		return err
	}
	prefix := strconv.Itoa(l.Subnet.Bits())
	for _, a := range []netip.Addr{l.APIServerIP, l.ServiceIP} {
		if err := ip("addr", "add", a.String()+"/"+prefix, "dev", l.Bridge); err != nil {
			return err
		}
	}
	if err := ip("link", "set", l.Bridge, "up"); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		steps := [][]string{
			{"netns", "add", n.Netns},
			{"link", "add", n.Veth, "type", "veth", "peer", "name", "eth0", "netns", n.Netns},
			{"link", "set", n.Veth, "master", l.Bridge, "up"},
			{"-n", n.Netns, "addr", "add", n.IP.String() + "/" + prefix, "dev", "eth0"},
			{"-n", n.Netns, "link", "set", "lo", "up"},
			{"-n", n.Netns, "link", "set", "eth0", "up"},
			{"route", "replace", n.PodCIDR.String(), "via", n.IP.String()},
		}
		for _, o := range c.Nodes {
			if o != n {
				steps = append(steps, []string{"-n", n.Netns, "route", "replace", o.PodCIDR.String(), "via", o.IP.String()})
			}
		}
		for _, s := range steps {
			if err := ip(s...); err != nil {
				return err
			}
		}
		// Pods reach the other nodes through the node: forward inside the node's namespace.
		if out, err := exec.Command("nsenter", "--net="+netnsPath(n.Netns), "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
			return fmt.Errorf("ip_forward in %s: %w: %s", n.Netns, err, out)
		}
	}
	return nil
}

// netDown removes what netUp made (deleting a namespace or the bridge takes its routes along).
// Missing pieces are not errors.
func netDown(l layout, nodes []*Node) {
	for _, n := range nodes {
		_ = ip("route", "del", n.PodCIDR.String())
		_ = ip("link", "del", n.Veth)
		_ = ip("netns", "del", n.Netns)
	}
	_ = ip("link", "del", l.Bridge)
}

// netnsPIDs returns the processes whose network namespace is the one mounted at path, sorted.
func netnsPIDs(path string) ([]int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, err
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	return procsMatching(func(pid string) bool {
		link, err := os.Readlink(filepath.Join("/proc", pid, "ns", "net"))
		return err == nil && link == want
	}), nil
}

// procsMatching returns every process id in /proc for which match holds, sorted.
func procsMatching(match func(pid string) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if match(e.Name()) {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

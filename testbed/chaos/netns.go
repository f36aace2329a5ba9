package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Net is a private network of namespaces: a hub namespace holding a bridge, and one namespace per
// member joined to it by a veth pair, with an address in Subnet. Nothing is created in the caller's
// namespace, so the faults it injects touch nobody else's traffic. Every name starts with Prefix.
type Net struct {
	// Prefix starts the name of every namespace this Net creates (unique per run).
	Prefix string

	mu      sync.Mutex
	members map[string]string // member -> its address
	next    int
}

// Subnet is the members' network, only ever present inside the namespaces.
const Subnet = "10.213.0.0/24"

// NewNet creates the hub namespace. Close removes every namespace it created.
func NewNet(prefix string) (*Net, error) {
	n := &Net{Prefix: prefix, members: map[string]string{}, next: 10}
	hub := n.ns("hub")
	if err := run("ip", "netns", "add", hub); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", hub, "link", "add", "br0", "type", "bridge"},
		{"-n", hub, "link", "set", "br0", "up"},
		{"-n", hub, "link", "set", "lo", "up"},
	} {
		if err := run("ip", args...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

func (n *Net) ns(member string) string { return n.Prefix + member }

// NS is the namespace name of a member.
func (n *Net) NS(member string) string { return n.ns(member) }

// Add creates a member's namespace, joins it to the bridge and returns its address.
func (n *Net) Add(member string) (string, error) {
	n.mu.Lock()
	n.next++
	addr := fmt.Sprintf("10.213.0.%d", n.next)
	n.members[member] = addr
	n.mu.Unlock()
	ns, hub := n.ns(member), n.ns("hub")
	if err := run("ip", "netns", "add", ns); err != nil {
		return "", err
	}
	for _, args := range [][]string{
		{"-n", hub, "link", "add", "h-" + member, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", hub, "link", "set", "h-" + member, "master", "br0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
	} {
		if err := run("ip", args...); err != nil {
			return "", err
		}
	}
	return addr, nil
}

// Addr is a member's address.
func (n *Net) Addr(member string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.members[member]
}

// Cut drops every packet between members a and b, in both directions (connections hang, as in a
// real partition; nothing is refused).
func (n *Net) Cut(a, b string) error { return n.filter("-A", a, b) }

// Heal undoes Cut.
func (n *Net) Heal(a, b string) error { return n.filter("-D", a, b) }

func (n *Net) filter(op, a, b string) error {
	for _, x := range [][2]string{{a, b}, {b, a}} {
		ns, peer := n.ns(x[0]), n.Addr(x[1])
		if err := run("ip", "netns", "exec", ns, "iptables", op, "INPUT", "-s", peer, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// Close deletes every namespace of this Net (with them their links and filters).
func (n *Net) Close() {
	n.mu.Lock()
	names := []string{n.ns("hub")}
	for m := range n.members {
		names = append(names, n.ns(m))
	}
	n.mu.Unlock()
	for _, ns := range names {
		_ = run("ip", "netns", "del", ns)
	}
}

// Command returns cmd to run bin with args inside member's network namespace (and only that: unlike
// ip netns exec, nsenter leaves /sys, and with it the cgroup filesystems, as they are). nsenter execs
// bin, so the started process's PID is bin's own.
func (n *Net) Command(member, bin string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.ns(member), "--", bin}, args...)...)
}

// DialContext dials addr from inside member's namespace: the socket lives there, the caller does not.
// The dialling thread enters the namespace and returns to its own before the Go scheduler may use it
// again; if it cannot return, it is never released (its goroutine exits locked, ending the thread).
// (Threads must not end needlessly: a child started with Pdeathsig dies with the thread that started it.)
func (n *Net) DialContext(ctx context.Context, member, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer own.Close()
		f, err := os.Open("/run/netns/" + n.ns(member))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("setns %s: %w", n.ns(member), err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

func run(bin string, args ...string) error {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

package baremetal

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/logind"
	"github.com/nodefence/nodefence/testbed/procs"
)

// example is one example environment file: from deploy/systemd/*.env.example or a block of
// deploy/baremetal.md.
type example struct {
	source string // where it was found
	file   string // the /etc/nodefence/… path the unit reads it from
	text   string // the file, verbatim
}

// envBlock finds, in deploy/baremetal.md, a `/etc/nodefence/NAME.env` (or .yaml) mention whose
// paragraph ends in a fenced block: the file's contents as the guide gives them.
var envBlock = regexp.MustCompile("`(/etc/(?:nodefence|etcd)/[a-z0-9-]+\\.(?:env|yaml))`[^\n]*(?:\n[^\n`]+)*\n\n```(?:sh|yaml)\n((?s:.*?))```")

// guideExamples returns every example settings file of deploy/baremetal.md and
// deploy/systemd/*.env.example, and the guide's fence.yaml.
func guideExamples(t *testing.T) (envs []example, fenceYAML string) {
	t.Helper()
	md, err := os.ReadFile("../../deploy/baremetal.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range envBlock.FindAllStringSubmatch(string(md), -1) {
		if strings.HasSuffix(m[1], ".yaml") {
			fenceYAML = m[2]
			continue
		}
		envs = append(envs, example{source: "deploy/baremetal.md " + m[1], file: m[1], text: m[2]})
	}
	files, err := filepath.Glob(filepath.Join(unitDir, "*.env.example"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := "/etc/nodefence/" + strings.TrimSuffix(filepath.Base(f), ".example")
		switch filepath.Base(name) {
		case "fence-driver.env":
			name = "/etc/nodefence/fence-driver-ipmi.env" // its own header names it so
		case "etcd.env":
			name = "/etc/etcd/etcd.env"
		}
		envs = append(envs, example{source: "deploy/systemd/" + filepath.Base(f), file: name, text: string(b)})
	}
	return envs, fenceYAML
}

// unitFor is the unit (and instance) that reads env file.
func unitFor(file string) (unit, instance string) {
	base := strings.TrimSuffix(filepath.Base(file), ".env")
	switch {
	case base == "coordinator":
		return "nodefence-coordinator.service", ""
	case base == "node-agent":
		return "nodefence-node-agent.service", ""
	case base == "etcd":
		return "etcd.service", ""
	case strings.HasPrefix(base, "fence-driver-"):
		return "nodefence-fence-driver@.service", strings.TrimPrefix(base, "fence-driver-")
	}
	return "", ""
}

// TestExampleSettingsStart starts every example settings file of the bare-metal guide and of
// deploy/systemd (etcd's too) as written, through its unit's ExecStart=, each in a network namespace of its
// own that holds the guide's host addresses (10.0.0.1–10.0.0.3), so every listen address binds
// as it would on h01. Only file paths move (into a per-example root with test certificates). The
// binary must bind every address its example names (a refused setting ends the process first).
func TestExampleSettingsStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	envs, fenceYAML := guideExamples(t)
	var sources []string
	for _, e := range envs {
		sources = append(sources, e.source)
	}
	// The guide's four env blocks and the four example files, at least: parsing never skips one.
	if len(envs) < 8 || fenceYAML == "" {
		t.Fatalf("found %d example settings files (%q) and fence.yaml %v; want 8 and a fence.yaml", len(envs), sources, fenceYAML != "")
	}
	bin := buildBinaries(t, "coordinator", "fence-driver", "node-agent")
	// etcd.service runs /usr/local/bin/etcd: the etcd v3.6 the Kubernetes tests use.
	_, etcd, err := kubetest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(etcd, filepath.Join(bin, "etcd")); err != nil {
		t.Fatal(err)
	}
	ca, etcdCA := newCA(t, "nodefence CA"), newCA(t, "nodefence etcd CA")
	for i, e := range envs {
		t.Run(strings.NewReplacer("/", "_", " ", "_").Replace(e.source), func(t *testing.T) {
			unit, instance := unitFor(e.file)
			if unit == "" {
				t.Fatalf("%s: no unit reads %s", e.source, e.file)
			}
			h := host{name: "h01", root: t.TempDir()}
			for _, c := range []struct{ file, role string }{{"coordinator", "coordinator/h01"}, {"driver", "driver/h01"}, {"agent", "agent/h07"}} {
				ca.issue(t, h.path("/etc/nodefence/tls/"+c.file), c.role, true)
			}
			writeFile(t, h.path("/etc/nodefence/tls/ca.crt"), ca.pem)
			etcdCA.issue(t, h.path("/etc/nodefence/tls/etcd-client"), "coordinator/nodefence-coordinator", false)
			writeFile(t, h.path("/etc/nodefence/tls/etcd-ca.crt"), etcdCA.pem)
			writeFile(t, h.path("/etc/nodefence/bmc-password"), "secret\n")
			etcdCA.issue(t, h.path("/etc/etcd/server"), "member/etcd", true)
			writeFile(t, h.path("/etc/etcd/ca.crt"), etcdCA.pem)
			writeFile(t, h.path("/etc/nodefence/fence.yaml"), strings.ReplaceAll(fenceYAML, "/etc/nodefence/", h.path("/etc/nodefence")+"/"))
			writeFile(t, h.path(e.file), e.text)
			env, err := ReadEnvFile(h.path(e.file))
			if err != nil {
				t.Fatal(err)
			}
			ns := fmt.Sprintf("nf-ex-%d-%d", os.Getpid(), i)
			newNetns(t, ns, "10.0.0.1", "10.0.0.2", "10.0.0.3")
			var extraEnv []string
			if unit == "nodefence-node-agent.service" {
				extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + startLogind(t)}
			}
			p := startUnitIn(t, h, ns, unit, instance, env, bin, extraEnv...)
			var want []listen
			for _, k := range slices.Sorted(maps.Keys(env)) {
				if strings.HasSuffix(k, "_LISTEN") {
					want = append(want, listen{flag: k, addr: env[k], udp: strings.Contains(k, "KDUMP")})
				}
			}
			if ip := env["NODEFENCE_ETCD_IP"]; ip != "" { // etcd.service's client and peer ports
				want = append(want, listen{flag: "NODEFENCE_ETCD_IP client", addr: ip + ":2379"}, listen{flag: "NODEFENCE_ETCD_IP peer", addr: ip + ":2380"})
			}
			if len(want) == 0 {
				t.Fatalf("%s names no listen address", e.source)
			}
			deadline := time.Now().Add(30 * time.Second)
			for _, l := range want {
				for !bound(t, p.PID(), l) {
					if exited, _ := p.Exited(); exited {
						b, _ := os.ReadFile(p.Log)
						t.Fatalf("%s: %s refused to start:\n%s", e.source, unit, lastLines(string(b), 20))
					}
					if time.Now().After(deadline) {
						b, _ := os.ReadFile(p.Log)
						t.Fatalf("%s: %s=%s never bound:\n%s", e.source, l.flag, l.addr, lastLines(string(b), 20))
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// newNetns creates network namespace name with lo up and addrs on it, removed when the test ends.
func newNetns(t *testing.T, name string, addrs ...string) {
	t.Helper()
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run("-n", name, "link", "set", "lo", "up")
	for _, a := range addrs {
		run("-n", name, "addr", "add", a+"/32", "dev", "lo")
	}
}

// startUnitIn is host.start for an environment already written, inside network namespace ns.
// extraEnv is the process environment it adds (NAME=value).
func startUnitIn(t *testing.T, h host, ns, unit, instance string, env map[string]string, bin string, extraEnv ...string) *procs.Proc {
	t.Helper()
	u, err := ReadUnit(filepath.Join(unitDir, unit))
	if err != nil {
		t.Fatal(err)
	}
	execStart, err := Specifiers(u.ExecStart, instance)
	if err != nil {
		t.Fatal(err)
	}
	args, err := CommandLine(execStart, env)
	if err != nil {
		t.Fatalf("%s: %v", unit, err)
	}
	for i, a := range args {
		if strings.HasPrefix(a, "/var/lib/nodefence/") || a == "/var/lib/etcd" {
			if err := os.MkdirAll(h.path(a), 0o700); err != nil { // systemd's StateDirectory=
				t.Fatal(err)
			}
		}
		if strings.HasPrefix(a, "/etc/etcd/") || a == "/var/lib/etcd" {
			args[i] = h.path(a)
		}
	}
	args = h.localize(args, bin)
	t.Logf("in %s: %s", ns, strings.Join(args, " "))
	// nsenter execs the binary (the process keeps this PID) and, unlike ip netns exec, leaves
	// /sys as it is: the agent reads its cgroups there.
	pre := append([]string{"--net=/run/netns/" + ns, "--", "env"}, extraEnv...)
	p, err := procs.Start(unit, filepath.Join(t.TempDir(), "log"), "nsenter", append(pre, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	return p
}

// startLogind runs a private system bus with the logind stand-in and returns its address. Its
// InhibitDelayMaxSec (5 min) is above every example's shutdown grace period, so an agent never
// writes a logind drop-in on this machine.
func startLogind(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bus, err := logind.StartBus(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Close)
	srv, err := logind.Serve(bus.Address, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return bus.Address
}

type listen struct {
	flag, addr string
	udp        bool
}

// bound reports whether the process pid (through its network namespace's /proc tables) has a
// socket bound to l.addr: listening for TCP, bound for UDP.
func bound(t *testing.T, pid int, l listen) bool {
	t.Helper()
	host, port, ok := strings.Cut(l.addr, ":")
	if !ok {
		t.Fatalf("%s=%q is not IP:PORT", l.flag, l.addr)
	}
	ip := [4]byte{}
	for i, part := range strings.Split(host, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || i > 3 {
			t.Fatalf("%s=%q: not an IPv4 address", l.flag, l.addr)
		}
		ip[i] = byte(n)
	}
	pn, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s=%q: bad port", l.flag, l.addr)
	}
	// /proc/net/{tcp,udp}: local_address as little-endian hex IP : hex port; state 0A is LISTEN.
	// An unspecified IPv4 address is a dual-stack IPv6 socket in Go.
	want := map[string]bool{fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], pn): true}
	if ip == [4]byte{} {
		want[fmt.Sprintf("%s:%04X", strings.Repeat("0", 32), pn)] = true
	}
	table, state := "tcp", "0A"
	if l.udp {
		table, state = "udp", "07"
	}
	for _, tab := range []string{table, table + "6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, tab))
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			if len(fields) > 3 && want[fields[1]] && fields[3] == state {
				return true
			}
		}
	}
	return false
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/procs"
)

// portPlan is where everything listens, on 127.0.0.1. With a base port B:
//
//	B+0 coordinator gRPC     B+1 fence-driver gRPC   B+2 coordinator metrics   B+3 fence-driver metrics
//	B+4 node-agent metrics   B+5 etcd client         B+6 etcd peer             B+7 kdump (UDP)
//	B+10 this host's BMC (UDP), B+11... the simulated nodes' BMCs (UDP)
//	B+40... the simulated nodes' agents' metrics
type portPlan struct {
	coord, driver, coordMetrics, driverMetrics, agentMetrics, etcdClient, etcdPeer int // TCP
	kdump, hostBMC                                                                 int // UDP
	simBMC                                                                         []int
	simMetrics                                                                     []int // TCP
}

// portSpan is how many ports from the base the plan uses.
func portSpan(simulated int) int { return 40 + simulated }

// planPorts lays the ports out from base, checking each is free, or picks free ports when base is 0
// (BMC ports 0: ipmisim picks them).
func planPorts(base, simulated int) (portPlan, error) {
	var p portPlan
	if base == 0 {
		for _, f := range []*int{&p.coord, &p.driver, &p.coordMetrics, &p.driverMetrics, &p.agentMetrics, &p.etcdClient, &p.etcdPeer} {
			port, err := procs.FreePort()
			if err != nil {
				return p, err
			}
			*f = port
		}
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return p, err
		}
		p.kdump = c.LocalAddr().(*net.UDPAddr).Port
		c.Close()
		p.simBMC = make([]int, simulated)
		p.simMetrics = make([]int, simulated)
		for i := range p.simMetrics {
			if p.simMetrics[i], err = procs.FreePort(); err != nil {
				return p, err
			}
		}
		return p, nil
	}
	type want struct {
		port   *int
		offset int
		udp    bool
		what   string
	}
	p.simBMC = make([]int, simulated)
	p.simMetrics = make([]int, simulated)
	wants := []want{
		{&p.coord, 0, false, "coordinator gRPC"}, {&p.driver, 1, false, "fence-driver gRPC"},
		{&p.coordMetrics, 2, false, "coordinator metrics"}, {&p.driverMetrics, 3, false, "fence-driver metrics"},
		{&p.agentMetrics, 4, false, "node-agent metrics"}, {&p.etcdClient, 5, false, "etcd client"},
		{&p.etcdPeer, 6, false, "etcd peer"}, {&p.kdump, 7, true, "kdump"}, {&p.hostBMC, 10, true, "this host's BMC"},
	}
	for i := range simulated {
		wants = append(wants, want{&p.simBMC[i], 11 + i, true, fmt.Sprintf("BMC of sim-%d", i+1)},
			want{&p.simMetrics[i], 40 + i, false, fmt.Sprintf("metrics of sim-%d's agent", i+1)})
	}
	// A testbed killed just before leaves children that die with it a moment later (their
	// Pdeathsig): a port still taken is looked at again for a few seconds.
	var taken []string
	for deadline := time.Now().Add(portWait); ; time.Sleep(100 * time.Millisecond) {
		taken = taken[:0]
		for _, w := range wants {
			*w.port = base + w.offset
			if err := portFree(*w.port, w.udp); err != nil {
				proto := "tcp"
				if w.udp {
					proto = "udp"
				}
				taken = append(taken, fmt.Sprintf("port %d/%s (%s) is taken on 127.0.0.1: %v", *w.port, proto, w.what, err))
			}
		}
		if len(taken) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(taken) > 0 {
		return p, fmt.Errorf("%s\n(is a testbed already running? choose other ports with --port-base N or %s=N; run uses N to N+%d)",
			strings.Join(taken, "\n"), portBaseEnv, portSpan(simulated)-1)
	}
	return p, nil
}

// portWait is how long a taken port is looked at again before the testbed gives up on it.
const portWait = 5 * time.Second

func portFree(port int, udp bool) error {
	addr := loopback(port)
	if udp {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return unwrapSys(err)
		}
		return c.Close()
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return unwrapSys(err)
	}
	return l.Close()
}

// unwrapSys shortens "listen tcp 127.0.0.1:7400: bind: address already in use" to its cause.
func unwrapSys(err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// waitTCP is Proc.WaitTCP that gives up when ctx ends (Ctrl-C while starting).
func waitTCP(ctx context.Context, p *procs.Proc, addr string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- p.WaitTCP(addr, timeout) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pidFile marks a run directory as the testbed's and names the process using it.
const pidFile = "testbed.pid"

// prepareRunDir empties dir for a new run: it must not exist, be empty, or be a run directory whose
// testbed is gone (killed: the next run clears what it left). A running testbed's is refused.
func prepareRunDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("run directory %s: %w", dir, err)
	case len(entries) > 0:
		data, err := os.ReadFile(filepath.Join(dir, pidFile))
		if err != nil {
			return fmt.Errorf("run directory %s: not empty and not a testbed's (no %s); give another --workdir", dir, pidFile)
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && testbedAlive(pid) {
			return fmt.Errorf("run directory %s: a testbed is running there (pid %d); stop it, or give another --workdir and --port-base", dir, pid)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("run directory %s: clearing what a stopped testbed left: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("run directory %s: %w", dir, err)
	}
	return os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
}

// testbedAlive reports whether pid is a running nodefence-testbed.
func testbedAlive(pid int) bool {
	if pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) != nil {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), "nodefence-testbed")
}

// lockedWriter serializes writes from the console's goroutines; write errors (a closed pipe) are
// the caller's to ignore.
type lockedWriter struct {
	mu sync.Mutex
	w  interface{ Write([]byte) (int, error) }
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

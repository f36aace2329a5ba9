package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/metrics"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/procs"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

type options struct {
	binDir, workDir string
	simulated       int
	portBase        int // 0: free ports
	grace           time.Duration
	fenceTimeout    time.Duration
	keep            bool
}

// sim is a simulated node: an in-process agent and its own BMC.
type sim struct {
	name, zone string
	bmc        *ipmisim.BMC
	cancel     context.CancelFunc
	done       chan struct{}
	mu         sync.Mutex // guards cancel, done and boots
	boots      int        // boots after the first: a node switched on again has a new boot id
	metrics    *metrics.Metrics
	agent      atomic.Pointer[agent.Agent] // the running agent, nil while the node is down
}

// Connected and Unacked are the current agent's, for its metrics.
func (s *sim) Connected() bool {
	a := s.agent.Load()
	return a != nil && a.Connected()
}

func (s *sim) Unacked() int {
	if a := s.agent.Load(); a != nil {
		return a.Unacked()
	}
	return 0
}

type cluster struct {
	opts                  options
	dir                   string
	hostName              string
	coordAddr, driverAddr string
	etcdAddr              string
	ports                 portPlan
	control               net.Listener // the control socket `crash` talks to, nil until served
	procs                 []*procs.Proc
	sims                  []*sim
	conn                  *grpc.ClientConn
	log                   *slog.Logger
	pki                   *pki.PKI
	operator              tlsfiles.Files // the testbed's own client certificate (operator/testbed)
	host                  *ipmisim.BMC   // this host's (simulated) BMC: every node that says hello is configured
	stopPower             context.CancelFunc
}

func startCluster(ctx context.Context, opts options, out io.Writer, log *slog.Logger) (*cluster, error) {
	c := &cluster{opts: opts, dir: opts.workDir, log: log}
	// Ports first: a taken port is an error naming it, before anything was started.
	var err error
	if c.ports, err = planPorts(opts.portBase, opts.simulated); err != nil {
		return nil, err
	}
	if err := prepareRunDir(c.dir); err != nil {
		return nil, err
	}
	if c.dir, err = filepath.Abs(c.dir); err != nil {
		return c, err
	}
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	host, _ := os.Hostname()
	c.hostName = strings.ToLower(host)
	if identity.ValidName(c.hostName) != nil {
		c.hostName = "this-host"
	}
	// Every component has its certificate: mutual TLS everywhere, as in production.
	if c.pki, err = pki.New(filepath.Join(c.dir, "pki")); err != nil {
		return c, err
	}
	if c.operator, err = c.pki.Files(identity.Operator, "testbed"); err != nil {
		return c, err
	}
	driverTLS, err := c.pki.Files(identity.Driver, "ipmi")
	if err != nil {
		return c, err
	}
	coordTLS, err := c.pki.Files(identity.Coordinator, "coordinator-1")
	if err != nil {
		return c, err
	}
	hostTLS, err := c.pki.Files(identity.Agent, c.hostName)
	if err != nil {
		return c, err
	}
	step("issued a CA and certificates (mutual TLS) in %s", c.pki.Dir)
	if err := c.startBMCs(step); err != nil {
		return c, err
	}

	if err := c.startDriver(ctx, driverTLS, step); err != nil {
		return c, err
	}

	if err := c.startCoordinator(ctx, coordTLS, step); err != nil {
		return c, err
	}

	if err := c.startAgents(ctx, hostTLS, step); err != nil {
		return c, err
	}

	if c.conn, err = dial.New(c.coordAddr, c.operator); err != nil {
		return c, err
	}
	want := append(c.simNames(), c.hostName)
	if err := c.waitNodes(ctx, 30*time.Second, func(n *coordv1.Node) bool {
		return n.Readiness == coordv1.Readiness_READINESS_READY && n.Connected
	}, want...); err != nil {
		return c, err
	}
	step("all %d nodes Ready and connected", len(want))
	return c, nil
}

// startBMCs starts the ipmi_sim BMCs: this host's and one per simulated node.
func (c *cluster) startBMCs(step func(format string, args ...any)) error {
	var err error
	if c.host, err = ipmisim.Start(filepath.Join(c.dir, "bmc-"+c.hostName), c.ports.hostBMC, "admin", "password"); err != nil {
		return fmt.Errorf("start BMC for %s: %w", c.hostName, err)
	}

	// BMCs, one per simulated node.
	for i := 1; i <= c.opts.simulated; i++ {
		name := fmt.Sprintf("sim-%d", i)
		bmc, err := ipmisim.Start(filepath.Join(c.dir, "bmc-"+name), c.ports.simBMC[i-1], "admin", "password")
		if err != nil {
			return fmt.Errorf("start BMC for %s: %w", name, err)
		}
		// sim-2 is alone in zone-b (a one-node zone is fully disrupted when that node dies, and the
		// storm guard never fences there); the others share zone-a with this host.
		zone := "zone-a"
		if i == 2 {
			zone = "zone-b"
		}
		if err := bmc.SetExternalPower(true); err != nil { // followPower is its supply
			return fmt.Errorf("BMC for %s: %w", name, err)
		}
		c.sims = append(c.sims, &sim{name: name, zone: zone, bmc: bmc})
	}
	step("started %d ipmi_sim BMCs: %s", len(c.sims)+1, strings.Join(c.bmcList(), ", "))
	return nil
}

// startDriver starts the IPMI fence-driver and waits until it listens.
func (c *cluster) startDriver(ctx context.Context, driverTLS tlsfiles.Files, step func(format string, args ...any)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.driverAddr = loopback(c.ports.driver)
	p, err := procs.Start("fence-driver", filepath.Join(c.dir, "fence-driver.log"), filepath.Join(c.opts.binDir, "fence-driver"),
		append([]string{"--driver", "ipmi", "--listen", c.driverAddr, "--metrics-listen", loopback(c.ports.driverMetrics),
			"--state-dir", filepath.Join(c.dir, "driver-state")}, pki.Args("", driverTLS)...)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := waitTCP(ctx, p, c.driverAddr, 15*time.Second); err != nil {
		return err
	}
	step("fence-driver (ipmi) listening on %s, pid %d", c.driverAddr, p.PID())
	return nil
}

// startCoordinator writes the fence configuration and starts the coordinator with embedded etcd.
func (c *cluster) startCoordinator(ctx context.Context, coordTLS tlsfiles.Files, step func(format string, args ...any)) error {
	cfgPath, err := c.writeFenceConfig()
	if err != nil {
		return err
	}
	c.coordAddr = loopback(c.ports.coord)
	c.etcdAddr = loopback(c.ports.etcdClient)
	coordArgs := append(pki.Args("", coordTLS), pki.Args("driver-", coordTLS)...)
	p, err := procs.Start("coordinator", filepath.Join(c.dir, "coordinator.log"), filepath.Join(c.opts.binDir, "coordinator"), append(coordArgs,
		"--listen", c.coordAddr, "--metrics-listen", loopback(c.ports.coordMetrics), "--config", cfgPath,
		"--data-dir", filepath.Join(c.dir, "coordinator"), "--etcd-client-listen", c.etcdAddr, "--etcd-peer-listen", loopback(c.ports.etcdPeer),
		"--etcd-unsafe-no-fsync", "--node-monitor-grace-period", c.opts.grace.String(), "--node-startup-grace-period", (2*c.opts.grace).String(),
		"--fence-timeout", c.opts.fenceTimeout.String(), "--node-eviction-rate", "1", "--fence-op-timeout", "15s",
		"--fence-retries", "1", "--fence-retry-backoff", "2s", "--election-ttl", "2s", "--id", "coordinator-1",
		"--kdump-listen", loopback(c.ports.kdump))...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := waitTCP(ctx, p, c.coordAddr, 60*time.Second); err != nil {
		return err
	}
	step("coordinator listening on %s with embedded etcd, pid %d", c.coordAddr, p.PID())
	return nil
}

// startAgents starts this host's node-agent and the simulated agents, each following its BMC's power.
func (c *cluster) startAgents(ctx context.Context, hostTLS tlsfiles.Files, step func(format string, args ...any)) error {
	p, err := procs.Start("node-agent", filepath.Join(c.dir, "node-agent.log"), filepath.Join(c.opts.binDir, "node-agent"), append(pki.Args("", hostTLS),
		"--coordinator", c.coordAddr, "--node-name", c.hostName, "--zone", "zone-a", "--region", "local",
		"--metrics-listen", loopback(c.ports.agentMetrics))...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	step("node-agent for this host (%s) started, pid %d", c.hostName, p.PID())
	if err := ctx.Err(); err != nil {
		return err
	}

	// Simulated agents, each with its metrics endpoint; a simulated node is powered by its BMC: its
	// agent stops when the BMC switches it off and starts again when it switches it on, as a real
	// machine's would.
	powerCtx, stopPower := context.WithCancel(context.Background())
	c.stopPower = stopPower
	for i, s := range c.sims {
		s.metrics = metrics.New(s)
		lis, err := net.Listen("tcp", loopback(c.ports.simMetrics[i]))
		if err != nil {
			return fmt.Errorf("metrics of %s: %w", s.name, err)
		}
		go func() { _ = s.metrics.Serve(powerCtx, lis, nil, c.log) }()
		if err := c.startSim(s); err != nil {
			return err
		}
	}
	step("simulated agents started: %s", strings.Join(c.simNames(), ", "))
	for _, s := range c.sims {
		go c.powerSim(powerCtx, s)
	}
	return nil
}

// writeFenceConfig writes the standalone fence configuration: one IPMI method per simulated node.
func (c *cluster) writeFenceConfig() (string, error) {
	pw := filepath.Join(c.dir, "bmc-password")
	if err := os.WriteFile(pw, []byte("password\n"), 0o600); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "drivers:\n  ipmi: {endpoint: %q}\n", c.driverAddr)
	fmt.Fprintf(&b, "templates:\n  bmc:\n    driver: ipmi\n    parameters: {lanplus: \"1\", cipher: \"3\", username: admin, password_file: %q}\n", pw)
	b.WriteString("nodes:\n")
	// This host is configured too (only configured nodes may say hello), with a simulated BMC.
	fmt.Fprintf(&b, "  %s:\n    zone: zone-a\n    region: local\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\"}}\n    steps:\n      power_management: [bmc]\n",
		c.hostName, c.host.Port)
	for _, s := range c.sims {
		fmt.Fprintf(&b, "  %s:\n    zone: %s\n    region: local\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\"}}\n    steps:\n      power_management: [bmc]\n",
			s.name, s.zone, s.bmc.Port)
	}
	path := filepath.Join(c.dir, "fence.yaml")
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// startSim runs a simulated agent in this process.
func (c *cluster) startSim(s *sim) error {
	files, err := c.pki.Files(identity.Agent, s.name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	boot := fmt.Sprintf("boot-%s-%d", s.name, s.boots)
	s.mu.Unlock()
	a, err := agent.New(agent.Config{
		Coordinators: []string{c.coordAddr}, TLS: files,
		NodeName: s.name, BootID: boot, Zone: s.zone, Region: "local", Log: c.log,
		Capacity: &agentv1.Capacity{MemoryBytes: 64 << 30, CpuMillis: 32000, Pids: 4194304},
	}, simSampler{s.metrics})
	if err != nil {
		return err
	}
	s.agent.Store(a)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.mu.Lock()
	s.cancel, s.done = cancel, done
	s.mu.Unlock()
	go func() { defer close(done); _ = a.Run(ctx) }()
	return nil
}

// simSampler reports a healthy, slowly varying memory.available, to the coordinator and the
// node's metrics.
type simSampler struct{ metrics *metrics.Metrics }

func (ss simSampler) Sample(context.Context) (*agentv1.SignalSample, error) {
	now := time.Now()
	avail := int64(40<<30) + int64(now.Second())<<24
	ss.metrics.Signal("memory.available", avail, 64<<30)
	return &agentv1.SignalSample{ObservedAt: timestamppb.New(now), Signals: []*agentv1.Signal{
		{Name: "memory.available", Available: avail, Capacity: 64 << 30},
	}}, nil
}

// silence stops a simulated node's agent, as if the node died.
func (s *sim) silence() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel = nil
	s.mu.Unlock()
	s.agent.Store(nil)
	if cancel != nil {
		cancel()
		<-done
	}
}

// waitNodes polls ListNodes until every named node satisfies ok.
func (c *cluster) waitNodes(ctx context.Context, timeout time.Duration, ok func(*coordv1.Node) bool, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli := coordv1.NewClusterServiceClient(c.conn)
	var last string
	for {
		resp, err := cli.ListNodes(ctx, &coordv1.ListNodesRequest{})
		if err == nil {
			byName := map[string]*coordv1.Node{}
			for _, n := range resp.Nodes {
				byName[n.Name] = n
			}
			all := true
			var states []string
			for _, name := range names {
				n := byName[name]
				if n == nil || !ok(n) {
					all = false
				}
				if n != nil {
					states = append(states, name+"="+n.Readiness.String())
				} else {
					states = append(states, name+"=absent")
				}
			}
			if all {
				return nil
			}
			last = strings.Join(states, " ")
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes not as expected after %s: %s", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *cluster) bmcList() []string {
	var out []string
	for _, s := range c.sims {
		out = append(out, fmt.Sprintf("%s=udp/%d", s.name, s.bmc.Port))
	}
	if c.host != nil {
		out = append([]string{fmt.Sprintf("%s=udp/%d", c.hostName, c.host.Port)}, out...)
	}
	return out
}

// victim is the simulated node a crash is shown on: the last one sharing zone-a with this host,
// where the storm guard lets a single dead node be fenced.
func (c *cluster) victim() *sim {
	for i := len(c.sims) - 1; i >= 0; i-- {
		if c.sims[i].zone == "zone-a" {
			return c.sims[i]
		}
	}
	return c.sims[0]
}

func (c *cluster) simNames() []string {
	var out []string
	for _, s := range c.sims {
		out = append(out, s.name)
	}
	return out
}

// stop stops everything this cluster started, agents first, by PID.
func (c *cluster) stop(out io.Writer, keep bool) {
	if c.stopPower != nil {
		c.stopPower()
	}
	for _, s := range c.sims {
		s.silence()
	}
	if c.control != nil {
		c.control.Close()
	}
	if c.conn != nil {
		c.conn.Close()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(10 * time.Second); err != nil {
			fmt.Fprintln(out, "warning:", err)
		}
	}
	for _, s := range c.sims {
		if s.bmc != nil {
			_ = s.bmc.Stop()
		}
	}
	if c.host != nil {
		_ = c.host.Stop()
	}
	if !keep {
		if err := os.RemoveAll(c.dir); err != nil {
			fmt.Fprintln(out, "warning:", err)
		}
	} else {
		fmt.Fprintf(out, "logs and state kept in %s (the next start clears it)\n", c.dir)
	}
}

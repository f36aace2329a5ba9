// Package chaos runs nodefence as real processes in network namespaces of its own — a 3-member etcd
// cluster, 3 coordinators, an IPMI fence-driver with ipmi_sim BMCs, and node-agents — injects faults
// (SIGKILL, SIGSTOP, link cuts, etcd member loss, driver restarts) and checks invariants over what the
// processes left behind: the etcd history, the BMCs' call logs and the driver's logs.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Options shape a cluster.
type Options struct {
	// Dir holds every process's data and log.
	Dir string
	// Bin holds the coordinator, fence-driver and node-agent binaries; Etcd is the etcd binary.
	Bin, Etcd string
	// Prefix starts every namespace name (unique per run).
	Prefix string
	// Agents is how many nodes run an agent (each has a BMC).
	Agents int
	// CoordinatorArgs are extra coordinator flags (grace periods, fence timeout).
	CoordinatorArgs []string
	// Log receives progress lines.
	Log func(format string, args ...any)
}

// Proc is one process of the cluster.
type Proc struct {
	Name, Member string
	Log          string
	bin          string
	args         []string
	net          *Net

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Cluster is a running system.
type Cluster struct {
	opts  Options
	Net   *Net
	Etcd  []*Proc
	Coord []*Proc
	// CoordAddr are the coordinators' gRPC addresses, in Coord's order.
	CoordAddr  []string
	EtcdURL    []string
	Driver     *Proc
	DriverAddr string
	Agents     []*Proc
	Nodes      []string
	BMCs       map[string]*ipmisim.BMC

	cli     *clientv3.Client
	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn
	pki     *pki.PKI
	// operator is the harness's own client identity.
	operator tlsfiles.Files
}

// Names of the members; "ctl" is where the harness's own clients dial from.
const (
	ctlMember    = "ctl"
	driverMember = "drv"
)

// Start brings the whole cluster up; Close stops it.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	nw, err := NewNet(o.Prefix)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, Net: nw, BMCs: map[string]*ipmisim.BMC{}, conns: map[string]*grpc.ClientConn{}}
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// tlsArgs issues role/name's certificate (for 127.0.0.1 and localhost: clients verify the name
// localhost, the namespaces' addresses are not in it) and returns its flags with prefix.
func (c *Cluster) tlsArgs(prefix string, role identity.Role, name string) ([]string, error) {
	f, err := c.pki.Files(role, name)
	if err != nil {
		return nil, err
	}
	return append(pki.Args(prefix, f), "--"+prefix+"tls-server-name", "localhost"), nil
}

func (c *Cluster) start(ctx context.Context) error {
	o := c.opts
	var err error
	if c.pki, err = pki.New(filepath.Join(o.Dir, "pki")); err != nil {
		return err
	}
	if c.operator, err = c.pki.Files(identity.Operator, "chaos"); err != nil {
		return err
	}
	c.operator.ServerName = "localhost"
	if _, err := c.Net.Add(ctlMember); err != nil {
		return err
	}
	if err := c.startEtcd(ctx); err != nil {
		return err
	}

	// The fence-driver and the BMCs share a namespace: the driver reaches them on its 127.0.0.1.
	daddr, err := c.Net.Add(driverMember)
	if err != nil {
		return err
	}
	c.DriverAddr = daddr + ":7101"
	for i := 1; i <= o.Agents; i++ {
		n := fmt.Sprintf("n%d", i)
		bmc, err := ipmisim.StartIn(c.Net.NS(driverMember), filepath.Join(o.Dir, "bmc-"+n), 6230+i, "admin", "password")
		if err != nil {
			return fmt.Errorf("BMC of %s: %w", n, err)
		}
		c.BMCs[n] = bmc
		c.Nodes = append(c.Nodes, n)
	}
	driverTLS, err := c.pki.Files(identity.Driver, "ipmi")
	if err != nil {
		return err
	}
	c.Driver = c.proc("fence-driver", driverMember, filepath.Join(o.Bin, "fence-driver"), append([]string{"--driver", "ipmi", "--listen", c.DriverAddr,
		"--state-dir", filepath.Join(o.Dir, "driver-state"), "--log-level", "debug"}, pki.Args("", driverTLS)...)...)
	if err := c.Driver.Start(); err != nil {
		return err
	}
	cfg, err := c.writeConfig()
	if err != nil {
		return err
	}
	if err := c.startCoordinators(cfg); err != nil {
		return err
	}
	if _, err := c.WaitLeader(ctx, 60*time.Second, 0); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if _, err := c.Net.Add(n); err != nil {
			return err
		}
		agentTLS, err := c.tlsArgs("", identity.Agent, n)
		if err != nil {
			return err
		}
		p := c.proc("agent-"+n, n, filepath.Join(o.Bin, "node-agent"), append([]string{"--coordinator", strings.Join(c.CoordAddr, ","),
			"--node-name", n, "--zone", "a", "--region", "r", "--nodefs-path", ""}, agentTLS...)...)
		if err := p.Start(); err != nil {
			return err
		}
		c.Agents = append(c.Agents, p)
	}
	return nil
}

// startEtcd starts the three etcd members, each in its own namespace, and waits until they take
// writes.
func (c *Cluster) startEtcd(ctx context.Context) error {
	o := c.opts
	// etcd: three members.
	var initial []string
	for i := 1; i <= 3; i++ {
		m := fmt.Sprintf("e%d", i)
		addr, err := c.Net.Add(m)
		if err != nil {
			return err
		}
		initial = append(initial, fmt.Sprintf("%s=http://%s:2380", m, addr))
		c.EtcdURL = append(c.EtcdURL, "http://"+addr+":2379")
	}
	for i := 1; i <= 3; i++ {
		m := fmt.Sprintf("e%d", i)
		addr := c.Net.Addr(m)
		p := c.proc(m, m, o.Etcd, "--name", m, "--data-dir", filepath.Join(o.Dir, m),
			"--listen-client-urls", "http://"+addr+":2379", "--advertise-client-urls", "http://"+addr+":2379",
			"--listen-peer-urls", "http://"+addr+":2380", "--initial-advertise-peer-urls", "http://"+addr+":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", o.Prefix,
			"--unsafe-no-fsync", "--log-level", "warn")
		if err := p.Start(); err != nil {
			return err
		}
		c.Etcd = append(c.Etcd, p)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.EtcdURL, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.Net.DialContext(ctx, ctlMember, "tcp", addr)
		})}})
	if err != nil {
		return err
	}
	c.cli = cli
	if err := poll(ctx, 30*time.Second, "etcd cluster healthy", func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := cli.Put(cctx, "/chaos/ready", "1")
		return err
	}); err != nil {
		return err
	}
	o.Log("etcd: 3 members up: %s", strings.Join(c.EtcdURL, ","))
	return nil
}

// startCoordinators starts the three coordinators, each in its own namespace, with configuration cfg.
func (c *Cluster) startCoordinators(cfg string) error {
	o := c.opts
	for i := 1; i <= 3; i++ {
		m := fmt.Sprintf("c%d", i)
		addr, err := c.Net.Add(m)
		if err != nil {
			return err
		}
		c.CoordAddr = append(c.CoordAddr, addr+":7001")
		srvTLS, err := c.pki.Files(identity.Coordinator, m)
		if err != nil {
			return err
		}
		drvTLS, err := c.tlsArgs("driver-", identity.Coordinator, m)
		if err != nil {
			return err
		}
		args := append([]string{"--id", m, "--listen", addr + ":7001", "--config", cfg,
			"--etcd-endpoints", strings.Join(c.EtcdURL, ","), "--etcd-allow-open", "--metrics-listen", addr + ":9090"}, o.CoordinatorArgs...)
		args = append(append(args, pki.Args("", srvTLS)...), drvTLS...)
		p := c.proc(m, m, filepath.Join(o.Bin, "coordinator"), args...)
		if err := p.Start(); err != nil {
			return err
		}
		c.Coord = append(c.Coord, p)
	}
	return nil
}

func (c *Cluster) writeConfig() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "drivers:\n  ipmi: {endpoint: %q}\ntemplates:\n  bmc: {driver: ipmi, parameters: {lanplus: \"1\", cipher: \"3\", username: admin, password: password}}\nnodes:\n", c.DriverAddr)
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "  %s:\n    zone: a\n    region: r\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\"}}\n    steps:\n      power_management: [bmc]\n", n, c.BMCs[n].Port)
	}
	p := filepath.Join(c.opts.Dir, "fence.yaml")
	return p, os.WriteFile(p, []byte(b.String()), 0o600)
}

func (c *Cluster) proc(name, member, bin string, args ...string) *Proc {
	return &Proc{Name: name, Member: member, Log: filepath.Join(c.opts.Dir, name+".log"), bin: bin, args: args, net: c.Net}
}

// Start (re)starts the process; its log is appended to.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	cmd := p.net.Command(p.Member, p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

// Running reports whether the process is up (it may be stopped with SIGSTOP).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process (by its PID) and, for SIGKILL, waits until it is reaped.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return errors.New(p.Name + " never started")
	}
	select {
	case <-exited:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	if sig == syscall.SIGKILL {
		<-exited
	}
	return nil
}

// Stop ends the process: SIGCONT (if it was stopped), SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Close stops every process and removes the namespaces.
func (c *Cluster) Close() {
	var ps []*Proc
	ps = append(ps, c.Agents...)
	ps = append(ps, c.Coord...)
	if c.Driver != nil {
		ps = append(ps, c.Driver)
	}
	ps = append(ps, c.Etcd...)
	for _, p := range ps {
		p.Stop(5 * time.Second)
	}
	for _, b := range c.BMCs {
		_ = b.Stop()
	}
	c.connsMu.Lock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.connsMu.Unlock()
	if c.cli != nil {
		c.cli.Close()
	}
	c.Net.Close()
}

// Etcd returns the harness's etcd client (dialling from its own namespace).
func (c *Cluster) EtcdClient() *clientv3.Client { return c.cli }

// Conn returns a client connection to addr from the harness's namespace.
func (c *Cluster) Conn(addr string) *grpc.ClientConn {
	c.connsMu.Lock()
	defer c.connsMu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc
	}
	tc, err := c.operator.Client()
	if err != nil {
		panic(err) // the files were just written
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return c.Net.DialContext(ctx, ctlMember, "tcp", a)
		}))
	if err != nil {
		panic(err) // only a malformed target fails here
	}
	c.conns[addr] = cc
	return cc
}

// Leader is what the election says.
type Leader struct {
	Index int // into Coord
	ID    string
	Epoch int64
}

// CurrentLeader reads the election from etcd: the oldest key under the coordinators' prefix.
func (c *Cluster) CurrentLeader(ctx context.Context) (Leader, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/nodefence/leader/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return Leader{}, false, err
	}
	kv := resp.Kvs[0]
	for i, p := range c.Coord {
		if strings.Contains(string(kv.Value), `"id":"`+p.Name+`"`) {
			return Leader{Index: i, ID: p.Name, Epoch: kv.CreateRevision}, true, nil
		}
	}
	return Leader{}, false, fmt.Errorf("leader key %s names no coordinator: %s", kv.Key, kv.Value)
}

// WaitLeader waits for a leader with an epoch above after that answers ListNodes as leader.
func (c *Cluster) WaitLeader(ctx context.Context, timeout time.Duration, after int64) (Leader, error) {
	var l Leader
	err := poll(ctx, timeout, "a leader", func() error {
		cur, ok, err := c.CurrentLeader(ctx)
		if err != nil || !ok {
			return fmt.Errorf("no leader key (%v)", err)
		}
		if cur.Epoch <= after {
			return fmt.Errorf("leader %s epoch %d is not newer than %d", cur.ID, cur.Epoch, after)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := coordv1.NewClusterServiceClient(c.Conn(c.CoordAddr[cur.Index])).ListNodes(cctx, &coordv1.ListNodesRequest{}); err != nil {
			return fmt.Errorf("leader %s: %v", cur.ID, err)
		}
		l = cur
		return nil
	})
	return l, err
}

// ConnectedNodes lists the nodes whose agents have a stream open to coordinator i.
func (c *Cluster) ConnectedNodes(ctx context.Context, i int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := coordv1.NewClusterServiceClient(c.Conn(c.CoordAddr[i])).ListNodes(ctx, &coordv1.ListNodesRequest{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range resp.Nodes {
		if n.Connected {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// poll calls f until it succeeds, ctx ends or timeout passes.
func poll(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: not within %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

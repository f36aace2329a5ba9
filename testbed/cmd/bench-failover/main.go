// Command bench-failover measures how fast nodefence recovers from the leader's death. It starts a
// 3-member etcd cluster, 3 coordinators with their default election lease and grace periods, an
// IPMI fence-driver with one ipmi_sim BMC, and N simulated agents (grpc-go streams that follow the
// coordinators' leader redirects as the real agent does) — all real processes on 127.0.0.1. Each
// round starts a fence, kills the leader with SIGKILL while the BMC is switching off, and measures:
// the new leader elected, the fence resumed (the driver called with the new epoch), and every agent
// streaming to the new leader. Then it checks the fence ended with one power-off, no driver call ran
// with a stale epoch and no other node was fenced. The LAST line of output is one JSON object.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/benchkit"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/procs"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

type result struct {
	Bench           string  `json:"bench"`
	Rounds          int     `json:"rounds"`
	Agents          int     `json:"agents"`
	ElectedP50      float64 `json:"elected_p50_s"`
	ResumedP50      float64 `json:"resumed_p50_s"`
	ResumedMax      float64 `json:"resumed_max_s"`
	AgentsBackP50   float64 `json:"agents_back_p50_s"`
	AgentsBackMax   float64 `json:"agents_back_max_s"`
	LeaderRSSMB     float64 `json:"leader_rss_mb"`
	DoubleFences    int     `json:"double_fences"`
	StaleEpochCalls int     `json:"stale_epoch_calls"`
	LiveNodesFenced int     `json:"live_nodes_fenced"`
}

func main() {
	fleet := benchkit.RegisterFleet(flag.CommandLine, "coordinator and fence-driver binaries")
	rounds := flag.Int("rounds", 10, "leader kills")
	flag.Parse()
	problems := fleet.Problems(50000)
	if *rounds < 1 || *rounds > 100 {
		problems = append(problems, "--rounds: must be 1..100")
	}
	benchkit.Main("bench-failover", problems, func(ctx context.Context) (*result, error) {
		return run(ctx, fleet, *rounds)
	})
}

// bench is the running system.
type bench struct {
	dir        string
	etcd       []*procs.Proc
	coord      []*procs.Proc
	coordArgs  [][]string
	coordAddr  []string
	driver     *procs.Proc
	bmc        *ipmisim.BMC
	cli        *clientv3.Client
	conns      map[string]*grpc.ClientConn
	agentConns [][]*grpc.ClientConn // per coordinator, per group of streams
}

const victim = "victim"

func run(ctx context.Context, fleet *benchkit.Fleet, rounds int) (_ *result, err error) {
	binDir, agents, perConn := fleet.Bin, fleet.Agents, fleet.PerConn
	dir, err := os.MkdirTemp("", "bench-failover-")
	if err != nil {
		return nil, err
	}
	b := &bench{dir: dir, conns: map[string]*grpc.ClientConn{}}
	defer func() {
		if err == nil {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintln(os.Stderr, "logs kept in", dir)
		}
	}()
	defer b.close()
	if err := b.start(ctx, binDir, agents); err != nil {
		return nil, err
	}
	leader, err := b.waitLeader(ctx, 0)
	if err != nil {
		return nil, err
	}
	fmt.Printf("leader %s; connecting %d agents\n", b.coordAddr[leader.idx], agents)

	// The agents: each keeps a stream to the leader, following redirects, and notes when its latest
	// stream was answered.
	if err := b.dialAgents(fleet); err != nil {
		return nil, err
	}
	actx, stop := context.WithCancel(ctx)
	defer stop()
	answered := make([]atomic.Int64, agents) // unix nanos of each agent's latest answered hello
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for i := 0; i < agents; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); b.agent(actx, i, perConn, leader.idx, &answered[i]) }()
		if i%500 == 499 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	allBack := func(after time.Time) bool {
		for i := range answered {
			if answered[i].Load() < after.UnixNano() {
				return false
			}
		}
		return true
	}
	if err := waitConnected(ctx, answered, allBack); err != nil {
		return nil, err
	}
	fmt.Printf("all %d agents connected\n", agents)

	var elected, resumed, back []float64
	var rss float64
	doubles := 0
	for r := 1; r <= rounds; r++ {
		var st roundStats
		if leader, st, err = b.round(ctx, r, leader, answered, allBack, agents, binDir, dir); err != nil {
			return nil, err
		}
		elected, resumed, back = append(elected, st.el.Seconds()), append(resumed, st.res.Seconds()), append(back, st.bk.Seconds())
		rss, doubles = st.rss, doubles+st.doubles
	}
	stale, live, err := b.audit(ctx)
	if err != nil {
		return nil, err
	}
	return &result{
		Bench: "failover", Rounds: rounds, Agents: agents,
		ElectedP50: round(quantile(elected, 0.5)), ResumedP50: round(quantile(resumed, 0.5)), ResumedMax: round(quantile(resumed, 1)),
		AgentsBackP50: round(quantile(back, 0.5)), AgentsBackMax: round(quantile(back, 1)), LeaderRSSMB: round(rss),
		DoubleFences: doubles, StaleEpochCalls: stale, LiveNodesFenced: live,
	}, nil
}

// dialAgents opens the agents' connections to every coordinator.
func (b *bench) dialAgents(fleet *benchkit.Fleet) error {
	for _, addr := range b.coordAddr {
		group, err := fleet.Conns(addr)
		if err != nil {
			return err
		}
		b.agentConns = append(b.agentConns, group)
	}
	return nil
}

// waitConnected waits until every agent's hello was answered, reporting progress every 10s.
func waitConnected(ctx context.Context, answered []atomic.Int64, allBack func(time.Time) bool) error {
	agents := len(answered)
	lastReport := time.Now()
	if err := poll(ctx, 5*time.Minute, func() bool {
		if time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			n := 0
			for i := range answered {
				if answered[i].Load() > 0 {
					n++
				}
			}
			fmt.Printf("%d of %d agents connected\n", n, agents)
		}
		return allBack(time.Unix(0, 1))
	}); err != nil {
		return fmt.Errorf("agents never all connected: %w", err)
	}
	return nil
}

// roundStats are one round's measurements: time to a new leader, to the fence's resumption and to
// every agent back, the new leader's RSS and the power-offs beyond one.
type roundStats struct {
	el, res, bk time.Duration
	rss         float64
	doubles     int
}

// round fences the victim, kills the leader while the power-off is in flight, measures the failover
// and restarts the killed coordinator as a follower. It returns the new leader.
func (b *bench) round(ctx context.Context, r int, leader leaderInfo, answered []atomic.Int64, allBack func(time.Time) bool,
	agents int, binDir, dir string) (leaderInfo, roundStats, error) {
	var rss float64
	doubles := 0
	if err := b.bmc.SetPower(true); err != nil {
		return leader, roundStats{}, err
	}
	if err := b.bmc.SetDelay(300 * time.Millisecond); err != nil {
		return leader, roundStats{}, err
	}
	calls0, err := b.bmc.Calls()
	if err != nil {
		return leader, roundStats{}, err
	}
	fc := coordv1.NewFenceServiceClient(b.conn(b.coordAddr[leader.idx]))
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	fr, err := fc.Fence(cctx, &coordv1.FenceRequest{Node: victim, Reason: fmt.Sprintf("bench-failover round %d", r)})
	cancel()
	if err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: fence: %w", r, err)
	}
	if err := poll(ctx, 20*time.Second, func() bool { c, _ := b.bmc.Calls(); return len(c) > len(calls0) }); err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: the power-off never reached the BMC: %w", r, err)
	}
	killed := time.Now()
	if err := syscall.Kill(b.coord[leader.idx].PID(), syscall.SIGKILL); err != nil {
		return leader, roundStats{}, err
	}
	old := leader
	if leader, err = b.waitLeader(ctx, old.epoch); err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: %w", r, err)
	}
	el := time.Since(killed)
	var res time.Duration
	if err := poll(ctx, 60*time.Second, func() bool {
		at, ok := b.driverCalled(leader.epoch)
		res = at.Sub(killed)
		return ok
	}); err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: the fence was not resumed: %w", r, err)
	}
	if err := poll(ctx, 60*time.Second, func() bool { return allBack(killed) }); err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: agents not back: %w", r, err)
	}
	var last int64
	for i := range answered {
		last = max(last, answered[i].Load())
	}
	bk := time.Unix(0, last).Sub(killed)
	if rss, err = benchkit.RSSMB(b.coord[leader.idx].PID()); err != nil {
		return leader, roundStats{}, err
	}
	rec, err := b.waitDone(ctx, leader.idx, fr.Fence.Id)
	if err != nil {
		return leader, roundStats{}, fmt.Errorf("round %d: %w", r, err)
	}
	calls, err := b.bmc.Calls()
	if err != nil {
		return leader, roundStats{}, err
	}
	if offs := ipmisim.PowerOffs(calls[len(calls0):]); offs != 1 || rec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		doubles += max(0, offs-1)
		fmt.Printf("round %d: fence %s %s with %d power-offs\n", r, rec.Id, rec.Status, offs)
	}
	fmt.Printf("round %d: leader %d -> %d: elected %.2fs, fence resumed %.2fs, %d agents back %.2fs; leader RSS %.0f MB\n",
		r, old.epoch, leader.epoch, el.Seconds(), res.Seconds(), agents, bk.Seconds(), rss)
	// The killed coordinator comes back as a follower.
	if b.coord[old.idx], err = procs.Start(fmt.Sprintf("c%d", old.idx+1), filepath.Join(dir, fmt.Sprintf("c%d-%d.log", old.idx+1, r)),
		filepath.Join(binDir, "coordinator"), b.coordArgs[old.idx]...); err != nil {
		return leader, roundStats{}, err
	}
	if err := b.coord[old.idx].WaitTCP(b.coordAddr[old.idx], 30*time.Second); err != nil {
		return leader, roundStats{}, err
	}
	return leader, roundStats{el: el, res: res, bk: bk, rss: rss, doubles: doubles}, nil
}

func (b *bench) start(ctx context.Context, binDir string, agents int) error {
	clientURLs, err := b.startEtcd(ctx)
	if err != nil {
		return err
	}
	if b.bmc, err = ipmisim.Start(filepath.Join(b.dir, "bmc"), 0, "admin", "password"); err != nil {
		return err
	}
	dport, err := procs.FreePort()
	if err != nil {
		return err
	}
	driverAddr := fmt.Sprintf("127.0.0.1:%d", dport)
	if b.driver, err = procs.Start("fence-driver", filepath.Join(b.dir, "driver.log"), filepath.Join(binDir, "fence-driver"),
		"--driver", "ipmi", "--listen", driverAddr, "--insecure", "--unauthenticated-caller", "any", "--state-dir", filepath.Join(b.dir, "driver-state")); err != nil {
		return err
	}
	if err := b.driver.WaitTCP(driverAddr, 30*time.Second); err != nil {
		return err
	}
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "drivers:\n  ipmi: {endpoint: %q}\ntemplates:\n  bmc: {driver: ipmi, parameters: {lanplus: \"1\", cipher: \"3\", username: admin, password: password}}\nnodes:\n", driverAddr)
	fmt.Fprintf(&yaml, "  %s: {zone: zone-0, region: bench, methods: {bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\"}}}, steps: {power_management: [bmc]}}\n", victim, b.bmc.Port)
	for i := 0; i < agents; i++ {
		fmt.Fprintf(&yaml, "  agent-%d: {zone: zone-%d, region: bench, methods: {bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"1\"}}}, steps: {power_management: [bmc]}}\n", i, i%10)
	}
	cfg := filepath.Join(b.dir, "fence.yaml")
	if err := os.WriteFile(cfg, []byte(yaml.String()), 0o600); err != nil {
		return err
	}
	for i := 1; i <= 3; i++ {
		port, err := procs.FreePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		args := []string{"--id", fmt.Sprintf("c%d", i), "--listen", addr, "--insecure", "--unauthenticated-caller", "any",
			"--driver-insecure", "--config", cfg, "--etcd-endpoints", strings.Join(clientURLs, ","), "--etcd-allow-open", "--kdump-listen=", "--log-level", "warn"}
		p, err := procs.Start(fmt.Sprintf("c%d", i), filepath.Join(b.dir, fmt.Sprintf("c%d.log", i)), filepath.Join(binDir, "coordinator"), args...)
		if err != nil {
			return err
		}
		b.coord, b.coordArgs, b.coordAddr = append(b.coord, p), append(b.coordArgs, args), append(b.coordAddr, addr)
	}
	for i, p := range b.coord {
		if err := p.WaitTCP(b.coordAddr[i], 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// startEtcd starts a three-member etcd cluster and returns its client URLs once it takes writes.
func (b *bench) startEtcd(ctx context.Context) ([]string, error) {
	etcdDir, err := kubetest.AssetsDir()
	if err != nil {
		return nil, err
	}
	etcdBin := filepath.Join(etcdDir, kubetest.EtcdBinary)
	var clientURLs, initial []string
	var peers []string
	for i := 1; i <= 3; i++ {
		cp, err := procs.FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := procs.FreePort()
		if err != nil {
			return nil, err
		}
		clientURLs = append(clientURLs, fmt.Sprintf("http://127.0.0.1:%d", cp))
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", pp))
		initial = append(initial, fmt.Sprintf("e%d=%s", i, peers[i-1]))
	}
	for i := 1; i <= 3; i++ {
		p, err := procs.Start(fmt.Sprintf("e%d", i), filepath.Join(b.dir, fmt.Sprintf("e%d.log", i)), etcdBin,
			"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(b.dir, fmt.Sprintf("e%d", i)),
			"--listen-client-urls", clientURLs[i-1], "--advertise-client-urls", clientURLs[i-1],
			"--listen-peer-urls", peers[i-1], "--initial-advertise-peer-urls", peers[i-1],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--unsafe-no-fsync", "--log-level", "warn")
		if err != nil {
			return nil, fmt.Errorf("etcd (make kube-assets builds it): %w", err)
		}
		b.etcd = append(b.etcd, p)
	}
	if b.cli, err = clientv3.New(clientv3.Config{Endpoints: clientURLs, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
		return nil, err
	}
	if err := poll(ctx, 30*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := b.cli.Put(cctx, "/bench/ready", "1")
		return err == nil
	}); err != nil {
		return nil, fmt.Errorf("etcd cluster: %w", err)
	}
	return clientURLs, nil
}

func (b *bench) close() {
	for _, g := range b.agentConns {
		for _, c := range g {
			c.Close()
		}
	}
	for _, c := range b.conns {
		c.Close()
	}
	for _, p := range b.coord {
		_ = p.Stop(10 * time.Second)
	}
	if b.driver != nil {
		_ = b.driver.Stop(5 * time.Second)
	}
	if b.bmc != nil {
		_ = b.bmc.Stop()
	}
	if b.cli != nil {
		b.cli.Close()
	}
	for _, p := range b.etcd {
		_ = p.Stop(5 * time.Second)
	}
}

func (b *bench) conn(addr string) *grpc.ClientConn {
	if c, ok := b.conns[addr]; ok {
		return c
	}
	c, err := dial.New(addr, tlsfiles.Files{Insecure: true})
	if err != nil {
		panic(err) // only a malformed address fails here
	}
	b.conns[addr] = c
	return c
}

type leaderInfo struct {
	idx   int
	epoch int64
}

// waitLeader waits for an election key newer than after whose coordinator answers as leader.
func (b *bench) waitLeader(ctx context.Context, after int64) (leaderInfo, error) {
	var l leaderInfo
	err := poll(ctx, 60*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := b.cli.Get(cctx, "/nodefence/leader/", clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision <= after {
			return false
		}
		var info struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(resp.Kvs[0].Value, &info) != nil {
			return false
		}
		i, err := strconv.Atoi(strings.TrimPrefix(info.ID, "c"))
		if err != nil || i < 1 || i > len(b.coord) {
			return false
		}
		l = leaderInfo{idx: i - 1, epoch: resp.Kvs[0].CreateRevision}
		return true
	})
	return l, err
}

// agent keeps one simulated agent streaming to the leader: a hello, then a heartbeat a second;
// after a stream ends it tries the leader a coordinator named, else the next coordinator, at once,
// and waits briefly only after a whole round failed (as node-agent does).
func (b *bench) driverCalled(epoch int64) (time.Time, bool) {
	f, err := os.Open(b.driver.Log)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	want := fmt.Sprintf(`"epoch":%d,`, epoch)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"msg":"fence operation`) || !strings.Contains(line, want) {
			continue
		}
		var op struct {
			Time    time.Time     `json:"time"`
			Elapsed time.Duration `json:"elapsed"`
		}
		if json.Unmarshal([]byte(line), &op) == nil {
			return op.Time.Add(-op.Elapsed), true // when the call arrived
		}
	}
	return time.Time{}, false
}

// waitDone waits for the record to finish.
func (b *bench) waitDone(ctx context.Context, idx int, id string) (*coordv1.NodeFence, error) {
	var rec *coordv1.NodeFence
	err := poll(ctx, 90*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, err := coordv1.NewFenceServiceClient(b.conn(b.coordAddr[idx])).GetFence(cctx, &coordv1.GetFenceRequest{Id: id})
		if err != nil {
			return false
		}
		rec = r.Fence
		return rec.FinishedAt != nil
	})
	if err != nil {
		return nil, fmt.Errorf("fence %s did not finish: %w", id, err)
	}
	return rec, nil
}

// audit counts driver operations run with an epoch below one already run on the device, and fence
// records of nodes other than the victim.
func (b *bench) audit(ctx context.Context) (stale, live int, err error) {
	data, err := os.ReadFile(b.driver.Log)
	if err != nil {
		return 0, 0, err
	}
	type op struct {
		Time    time.Time     `json:"time"`
		Msg     string        `json:"msg"`
		Epoch   int64         `json:"epoch"`
		Device  string        `json:"device"`
		Result  string        `json:"result"`
		Elapsed time.Duration `json:"elapsed"`
	}
	var ops []op
	for _, line := range strings.Split(string(data), "\n") {
		var o op
		if json.Unmarshal([]byte(line), &o) == nil && o.Msg == "fence operation" && o.Result != "rejected" {
			o.Time = o.Time.Add(-o.Elapsed)
			ops = append(ops, o)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Time.Before(ops[j].Time) })
	highest := map[string]int64{}
	for _, o := range ops {
		if o.Epoch < highest[o.Device] {
			stale++
		}
		highest[o.Device] = max(highest[o.Device], o.Epoch)
	}
	for _, addr := range b.coordAddr {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := coordv1.NewFenceServiceClient(b.conn(addr)).ListFences(cctx, &coordv1.ListFencesRequest{Limit: 1000})
		cancel()
		if err != nil {
			continue
		}
		for _, f := range resp.Fences {
			if f.Node != victim {
				live++
			}
		}
		return stale, live, nil
	}
	return stale, live, errors.New("no coordinator listed the fence records")
}

func poll(ctx context.Context, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[min(len(s)-1, int(q*float64(len(s)-1)+0.5))]
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

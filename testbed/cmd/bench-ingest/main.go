// Command bench-ingest measures how many agent updates the coordinator applies per second. It starts
// a real coordinator process (bin/coordinator, embedded etcd) and, in this process, N simulated agents
// over real gRPC streams on 127.0.0.1, each sending signal samples at a fixed rate. After a warm-up it
// measures for a window: updates applied per second (the coordinator's own counter), latency from a
// sample's send time to the engine having applied it (the coordinator's histogram), and the
// coordinator's RSS and CPU. The LAST line of output is one JSON object.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/services/wire"
	"github.com/nodefence/nodefence/testbed/benchkit"
	"github.com/nodefence/nodefence/testbed/procs"
	"github.com/nodefence/nodefence/testbed/promscrape"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

type result struct {
	Bench        string  `json:"bench"`
	Agents       int     `json:"agents"`
	UpdatesPerS  float64 `json:"updates_per_s"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	ServerP99ms  float64 `json:"coordinator_queue_p99_ms"`
	RSSMB        float64 `json:"coordinator_rss_mb"`
	StacksMB     float64 `json:"coordinator_stacks_mb"`
	CPUCores     int     `json:"cpu_cores"`
	CoordCPU     float64 `json:"coordinator_cpu_cores_used"`
	GenCPU       float64 `json:"generator_cpu_cores_used"`
	CoordGC      int     `json:"coordinator_gc_percent"`
	GenGC        int     `json:"generator_gc_percent"`
	OfferedPerS  float64 `json:"offered_per_s"`
	SendErrors   int64   `json:"send_errors"`
	WindowS      float64 `json:"window_s"`
	RatePerAgent float64 `json:"rate_per_agent"`
	Client       string  `json:"client"`
	// ConnectS is the time from the first hello until every agent was connected; HelloRetries
	// counts the hellos refused and retried (as agents do, with backoff) on the way.
	ConnectS     float64 `json:"connect_s"`
	HelloRetries int64   `json:"hello_retries"`
	// The cost of one update, less sensitive to a shared machine's load than p99: CPU seconds
	// per 1,000 updates applied (coordinator and generator), and the coordinator's heap
	// allocations (count and bytes, its Go runtime's counters) per update, over the window.
	CoordCPUPer1k   float64 `json:"coordinator_cpu_s_per_1k_updates"`
	GenCPUPer1k     float64 `json:"generator_cpu_s_per_1k_updates"`
	AllocsPerUpdate float64 `json:"coordinator_allocs_per_update"`
	BytesPerUpdate  float64 `json:"coordinator_alloc_bytes_per_update"`
}

func main() {
	fleet := benchkit.RegisterFleet(flag.CommandLine, "coordinator binary")
	rate := flag.Float64("rate", 5, "updates per second per agent")
	warmup := flag.Duration("warmup", 10*time.Second, "time after all agents connected before measuring")
	window := flag.Duration("window", 20*time.Second, "measurement window")
	coordGC := flag.Int("coordinator-gc-percent", 0, "the coordinator's --gc-percent (0: its default)")
	genGC := flag.Int("generator-gc-percent", 100, "GOGC of the load generator itself")
	client := flag.String("client", "h2", `how the simulated agents speak gRPC: "h2" (this program's own HTTP/2 framing, light enough to leave the machine to the coordinator) or "grpc" (grpc-go's client, as the real agent)`)
	flag.Parse()
	problems := fleet.Problems(100000)
	if *rate <= 0 || *rate > 100 {
		problems = append(problems, "--rate: must be in (0, 100]")
	}
	if *window < time.Second || *window > 10*time.Minute || *warmup < 0 || *warmup > 10*time.Minute {
		problems = append(problems, "--window: 1s..10m, --warmup: 0..10m")
	}
	if *client != "h2" && *client != "grpc" {
		problems = append(problems, `--client: must be "h2" or "grpc"`)
	}
	if *coordGC < 0 || *genGC < 1 {
		problems = append(problems, "--coordinator-gc-percent: must not be negative; --generator-gc-percent: must be at least 1")
	}
	debug.SetGCPercent(*genGC)
	benchkit.Main("bench-ingest", problems, func(ctx context.Context) (*result, error) {
		res, err := run(ctx, fleet, *client, *rate, *coordGC, *warmup, *window)
		if err == nil {
			res.GenGC, res.Client = *genGC, *client
		}
		return res, err
	})
}

func run(ctx context.Context, fleet *benchkit.Fleet, client string, rate float64, coordGC int, warmup, window time.Duration) (*result, error) {
	binDir, agents, perConn := fleet.Bin, fleet.Agents, fleet.PerConn
	dir, err := os.MkdirTemp("", "bench-ingest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	addr, maddr, args, err := coordinatorSetup(dir, agents, rate, coordGC)
	if err != nil {
		return nil, err
	}
	coord, err := procs.Start("coordinator", filepath.Join(dir, "coordinator.log"), filepath.Join(binDir, "coordinator"), args...)
	if err != nil {
		return nil, err
	}
	defer coord.Stop(10 * time.Second)
	if err := coord.WaitTCP(addr, 60*time.Second); err != nil {
		return nil, err
	}
	fmt.Printf("coordinator pid %d on %s; connecting %d agents (%s client) at %g updates/s each (%d streams per connection)\n", coord.PID(), addr, agents, client, rate, perConn)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var connected, sendErrs, retries atomic.Int64
	agentRun, closeConns, err := agentClients(ctx, runCtx, fleet, client, addr, rate)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	connectS, wg, err := timed(func() (*sync.WaitGroup, error) {
		return startAgents(ctx, runCtx, agents, agentRun, &connected, &sendErrs, &retries)
	})
	if err != nil {
		return nil, err
	}
	fmt.Printf("all %d agents connected in %.1fs (%d hellos refused and retried); warming up for %s\n", agents, connectS, retries.Load(), warmup)
	time.Sleep(warmup)
	metricsURL := "http://" + maddr + "/metrics"
	before, err := promscrape.Get(metricsURL)
	if err != nil {
		return nil, err
	}
	cpu0, gen0, err := cpuBoth(coord.PID())
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	defer startProfiles(maddr, window)()
	time.Sleep(window)
	after, err := promscrape.Get(metricsURL)
	if err != nil {
		return nil, err
	}
	elapsed := time.Since(t0).Seconds()
	cpu1, _ := cpuSeconds(coord.PID())
	gen1, _ := cpuSeconds(os.Getpid())
	rss, err := benchkit.RSSMB(coord.PID())
	if err != nil {
		return nil, err
	}
	stop()
	wg.Wait()
	p50, err := promscrape.Quantile(before, after, "nodefence_sample_apply_latency_seconds", 0.50)
	if err != nil {
		return nil, err
	}
	p99, _ := promscrape.Quantile(before, after, "nodefence_sample_apply_latency_seconds", 0.99)
	sp99, _ := promscrape.Quantile(before, after, "nodefence_engine_queue_latency_seconds", 0.99)
	updates := after["nodefence_agent_updates_total"] - before["nodefence_agent_updates_total"]
	gogc := int(after["go_gc_gogc_percent"]) // what the coordinator's runtime had in force
	perUpdate := func(metric string) float64 { return round3((after[metric] - before[metric]) / max(updates, 1)) }
	return &result{
		Bench: "ingest", Agents: agents, UpdatesPerS: round(updates / elapsed), P50ms: round(p50 * 1000), P99ms: round(p99 * 1000), ServerP99ms: round(sp99 * 1000),
		RSSMB: round(rss), CPUCores: runtime.NumCPU(), CoordCPU: round((cpu1 - cpu0) / elapsed), GenCPU: round((gen1 - gen0) / elapsed),
		StacksMB: round(after["go_memstats_stack_inuse_bytes"] / (1 << 20)), CoordGC: gogc, OfferedPerS: round(float64(agents) * rate), SendErrors: sendErrs.Load(), WindowS: round(elapsed), RatePerAgent: rate,
		ConnectS: round(connectS), HelloRetries: retries.Load(),
		CoordCPUPer1k: round3((cpu1 - cpu0) / max(updates, 1) * 1000), GenCPUPer1k: round3((gen1 - gen0) / max(updates, 1) * 1000),
		AllocsPerUpdate: perUpdate("go_memstats_mallocs_total"), BytesPerUpdate: perUpdate("go_memstats_alloc_bytes_total"),
	}, nil
}

// coordinatorSetup writes the fence configuration below dir and returns the coordinator's address,
// metrics address and arguments.
func coordinatorSetup(dir string, agents int, rate float64, coordGC int) (string, string, []string, error) {
	cfg := filepath.Join(dir, "fence.yaml")
	// Only configured nodes may say hello: every agent is a node (the driver is never called in
	// this benchmark).
	var yaml strings.Builder
	yaml.WriteString("drivers:\n  ipmi: {endpoint: \"127.0.0.1:1\"}\ntemplates:\n  bmc: {driver: ipmi}\nnodes:\n")
	for i := 0; i < agents; i++ {
		fmt.Fprintf(&yaml, "  agent-%d: {zone: zone-%d, region: bench, methods: {bmc: {template: bmc}}, steps: {power_management: [bmc]}}\n", i, i%10)
	}
	if err := os.WriteFile(cfg, []byte(yaml.String()), 0o600); err != nil {
		return "", "", nil, err
	}
	port, err := procs.FreePort()
	if err != nil {
		return "", "", nil, err
	}
	mport, err := procs.FreePort()
	if err != nil {
		return "", "", nil, err
	}
	addr, maddr := "127.0.0.1:"+strconv.Itoa(port), "127.0.0.1:"+strconv.Itoa(mport)
	args := []string{"--listen", addr, "--metrics-listen", maddr, "--pprof", "--insecure", "--unauthenticated-caller", "any", "--kdump-listen=", "--driver-insecure", "--config", cfg,
		"--data-dir", filepath.Join(dir, "data"), "--etcd-client-listen", "127.0.0.1:0", "--etcd-peer-listen", "127.0.0.1:0",
		"--etcd-unsafe-no-fsync", "--log-level", "warn", "--node-monitor-grace-period", "1h", "--node-startup-grace-period", "1h",
		"--agent-heartbeat-interval", "10s", "--agent-sample-interval", fmt.Sprint(time.Duration(float64(time.Second) / rate))}
	if coordGC > 0 {
		args = append(args, "--gc-percent", strconv.Itoa(coordGC))
	}
	return addr, maddr, args, nil
}

// agentClients dials the connections of the client kind ("h2", else gRPC) and returns how agent i
// runs and how to close the connections (on an error they are closed already).
func agentClients(ctx, runCtx context.Context, fleet *benchkit.Fleet, client, addr string, rate float64) (agentFunc, func(), error) {
	agents, perConn := fleet.Agents, fleet.PerConn
	switch client {
	case "h2":
		var conns []*h2Conn
		closeAll := func() {
			for _, c := range conns {
				c.Close()
			}
		}
		for range (agents + perConn - 1) / perConn {
			c, err := dialH2(ctx, addr)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			conns = append(conns, c)
		}
		return func(i int, up func()) error { return agentH2(runCtx, conns[i/perConn], i, rate, up) }, closeAll, nil
	default:
		conns, err := fleet.Conns(addr)
		if err != nil {
			return nil, nil, err
		}
		closeAll := func() {
			for _, c := range conns {
				c.Close()
			}
		}
		return func(i int, up func()) error { return agentGRPC(runCtx, conns[i/perConn], i, rate, up) }, closeAll, nil
	}
}

// cpuBoth reads the CPU seconds the coordinator (pid) and this generator used so far.
func cpuBoth(pid int) (coord, gen float64, err error) {
	if coord, err = cpuSeconds(pid); err != nil {
		return 0, 0, err
	}
	gen, err = cpuSeconds(os.Getpid())
	return coord, gen, err
}

// timed runs f and says how many seconds it took.
func timed(f func() (*sync.WaitGroup, error)) (float64, *sync.WaitGroup, error) {
	start := time.Now()
	wg, err := f()
	return time.Since(start).Seconds(), wg, err
}

// agentFunc runs agent i until its context ends; it calls up once its hello was answered.
type agentFunc func(i int, up func()) error

// Hello retries back off as the node-agent's reconnects do: from helloBackoff, doubling, to
// helloBackoffMax, with jitter.
const (
	helloBackoff    = 200 * time.Millisecond
	helloBackoffMax = 5 * time.Second
)

// startAgents runs every agent, ramping up gently, and waits until all are connected. An agent
// whose hello is refused tries again with backoff, as a real agent does (counted in retries); one
// whose stream fails after its hello counts as a send error.
func startAgents(ctx, runCtx context.Context, agents int, agentRun agentFunc, connected, sendErrs, retries *atomic.Int64) (*sync.WaitGroup, error) {
	var wg sync.WaitGroup
	for i := 0; i < agents; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var up atomic.Bool
			onUp := func() { up.Store(true); connected.Add(1) }
			for backoff := helloBackoff; ; backoff = min(2*backoff, helloBackoffMax) {
				err := agentRun(i, onUp)
				if runCtx.Err() != nil {
					return
				}
				if up.Load() {
					if err != nil {
						fmt.Fprintf(os.Stderr, "agent %d: %v\n", i, err)
						sendErrs.Add(1)
					}
					return
				}
				retries.Add(1)
				select {
				case <-runCtx.Done():
					return
				case <-time.After(backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)))):
				}
			}
		}()
		if i%500 == 499 {
			time.Sleep(50 * time.Millisecond) // a gentle ramp: 10,000 hellos in about a second
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); connected.Load() < int64(agents); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("only %d of %d agents connected", connected.Load(), agents)
		}
	}
	return &wg, nil
}

// startProfiles starts the CPU profiles $BENCH_PROFILE (the coordinator's, over the measurement
// window) and $BENCH_SELF_PROFILE (the load generator's) ask for; the returned func stops the latter.
func startProfiles(maddr string, window time.Duration) func() {
	if p := os.Getenv("BENCH_PROFILE"); p != "" {
		go profile("http://"+maddr+"/debug/pprof/profile?seconds="+strconv.Itoa(int(window.Seconds())-1), p)
	}
	if p := os.Getenv("BENCH_SELF_PROFILE"); p != "" {
		// A CPU profile of the load generator itself, to see what the agents' side costs.
		if f, err := os.Create(p); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				return func() {
					pprof.StopCPUProfile()
					f.Close()
				}
			}
		}
	}
	return func() {}
}

// hello is agent i's first message.
func hello(i int) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: fmt.Sprintf("agent-%d", i), BootId: "bench", Zone: fmt.Sprintf("zone-%d", i%10), Region: "bench"}}}
}

// sampler is one agent's sample request, reused for every sample (it is encoded before it changes).
type sampler struct {
	req        *agentv1.ConnectRequest
	observedAt *timestamppb.Timestamp
	memory     *agentv1.Signal
}

func newSampler() *sampler {
	s := &sampler{observedAt: &timestamppb.Timestamp{}, memory: &agentv1.Signal{Name: "memory.available", Capacity: 64 << 30}}
	s.req = &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Sample{Sample: &agentv1.SignalSample{
		ObservedAt: s.observedAt,
		Signals:    []*agentv1.Signal{s.memory, {Name: "pid.available", Available: 4000000, Capacity: 4194304}},
	}}}
	return s
}

// next is sample seq, observed now.
func (s *sampler) next(seq uint64, now time.Time) *agentv1.ConnectRequest {
	s.req.Seq = seq
	s.observedAt.Seconds, s.observedAt.Nanos = now.Unix(), int32(now.Nanosecond())
	s.memory.Available = 8<<30 + int64(seq%1024)<<20
	return s.req
}

// pace calls send for samples 2, 3, ... at rate per second, the first at a random point of the
// first interval so that the agents spread over it, until ctx ends.
func pace(ctx context.Context, rate float64, send func(seq uint64) error) error {
	interval := time.Duration(float64(time.Second) / rate)
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Duration(rand.Int64N(int64(interval)))):
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := uint64(2); ; seq++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := send(seq); err != nil {
			return err
		}
	}
}

// agentH2 is one simulated agent on an h2Conn: a hello, then samples at rate. The connection's
// reader consumes the acks.
func agentH2(ctx context.Context, conn *h2Conn, i int, rate float64, up func()) error {
	stream, err := conn.open(agentv1.AgentService_Connect_FullMethodName)
	if err != nil {
		return err
	}
	var buf []byte
	send := func(m *agentv1.ConnectRequest) error {
		if buf, err = appendMessage(buf[:0], m); err != nil {
			return err
		}
		return conn.send(stream, buf)
	}
	if err := send(hello(i)); err != nil {
		return err
	}
	select {
	case <-stream.answered: // the AgentConfig, or the end of the stream
	case <-ctx.Done():
		return nil
	}
	if err := conn.streamErr(stream); err != nil {
		return err
	}
	up()
	err = pace(ctx, rate, func(seq uint64) error {
		buf = appendSample(buf[:0], seq, time.Now())
		return conn.send(stream, buf)
	})
	conn.closeSend(stream)
	return err
}

// agentGRPC is one simulated agent on a grpc-go connection: a hello, then samples at rate, reading
// acks. Responses are left undecoded.
func agentGRPC(ctx context.Context, conn *grpc.ClientConn, i int, rate float64, up func()) error {
	stream, err := agentv1.NewAgentServiceClient(conn).Connect(ctx, grpc.ForceCodecV2(wire.Codec()))
	if err != nil {
		return err
	}
	if err := stream.Send(hello(i)); err != nil {
		return err
	}
	var resp wire.Encoded
	if err := stream.RecvMsg(&resp); err != nil { // the AgentConfig
		return err
	}
	up()
	go func() {
		var ack wire.Encoded
		for stream.RecvMsg(&ack) == nil {
		}
	}()
	s := newSampler()
	err = pace(ctx, rate, func(seq uint64) error { return stream.Send(s.next(seq, time.Now())) })
	stream.CloseSend()
	return err
}

// profile saves a CPU profile of the coordinator (BENCH_PROFILE=file) taken during the window.
func profile(url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	io.Copy(f, resp.Body)
}

// cpuSeconds is utime+stime of pid (clock ticks are 100 Hz on Linux).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100, nil
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// round3 keeps three decimals (per-update costs are small).
func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// Command bench-agent measures the node agent on this host and prints, as its last line, one JSON
// object:
//
//	{"bench":"agent","rss_mb":..,"cpu_percent":..,"pressure_detect_ms_p50":..,"pressure_detect_ms_p99":..}
//
// It serves a recording AgentService on 127.0.0.1 (the coordinator side of the stream: it acks
// every message and timestamps condition changes) and runs the real node-agent binary against it,
// by default (--active) as in production: in Kubernetes mode against a real kube-apiserver (from
// testbed/kube/kubetest) with --pods pods bound to the measured node, and with its CRI client on a
// private containerd (testbed/containerdtest):
//
//  1. Footprint: the agent at 1 Hz sampling and heartbeats for --duration (default 60 s); RSS
//     (VmRSS) and CPU (utime+stime) read from /proc/<pid> — CPU as a percentage of one core.
//  2. Detection: --rounds times, a fresh agent with --eviction-hard=memory.available<X, X set 128 MiB
//     below the node's current memory.available, then a child process (this binary, --alloc) that
//     allocates and touches memory until it sees memory.available below X itself and reports that
//     instant; the latency is from that instant to the coordinator receiving MemoryPressure=True.
//     The child starts after a random pause of up to 200 ms, so that crossings fall at any phase of
//     the agent's reads.
//
// Usage: go build -o bin/node-agent ./node-agent/cmd/node-agent && go run ./testbed/cmd/bench-agent --agent=bin/node-agent
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/containerdtest"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

func main() {
	var (
		agentBin = flag.String("agent", "bin/node-agent", "the node-agent binary to measure")
		duration = flag.Duration("duration", 60*time.Second, "how long the footprint is measured")
		rounds   = flag.Int("rounds", 50, "memory-threshold crossings to time")
		margin   = flag.Int64("margin-mib", 128, "how far below the current memory.available the threshold is set, in MiB")
		alloc    = flag.Int64("alloc", 0, "internal: run as the allocating child with this threshold in bytes")
		active   = flag.Bool("active", true, "run the agent as in production: Kubernetes mode against a real kube-apiserver (a pod informer, the killer and the evictor) with --pods pods bound to its node, and a CRI client against a private containerd; false: standalone")
		pods     = flag.Int("pods", 30, "with --active, how many pods are bound to the measured node")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *alloc > 0 {
		os.Exit(allocate(*alloc))
	}
	if err := run(log, *agentBin, *duration, *rounds, *margin<<20, *active, *pods); err != nil {
		log.Error("bench failed", "error", err)
		os.Exit(1)
	}
}

// coordinator is the coordinator side of the stream: it acks everything and reports condition
// changes with the time they were received.
type coordinator struct {
	agentv1.UnimplementedAgentServiceServer
	changes chan change
}

type change struct {
	at       time.Time
	cond     *agentv1.ConditionChange
	nodeName string
}

func (c *coordinator) Connect(st agentv1.AgentService_ConnectServer) error {
	node := ""
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if h := m.GetHello(); h != nil {
			node = h.NodeName
		}
		if cc := m.GetCondition(); cc != nil {
			select {
			case c.changes <- change{at: time.Now(), cond: cc, nodeName: node}:
			default:
			}
		}
		if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
	}
}

func run(log *slog.Logger, agentBin string, duration time.Duration, rounds int, margin int64, active bool, pods int) error {
	if _, err := os.Stat(agentBin); err != nil {
		return fmt.Errorf("agent binary: %w (build it with: go build -o bin/node-agent ./node-agent/cmd/node-agent)", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	coord := &coordinator{changes: make(chan change, 1024)}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, coord)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	dir, err := os.MkdirTemp("", "bench-agent")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bootID := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(bootID, []byte("bench-boot-id\n"), 0o600); err != nil {
		return err
	}
	base := []string{"--coordinator=" + lis.Addr().String(), "--insecure", "--boot-id-file=" + bootID,
		"--sample-interval=1s", "--heartbeat-interval=1s", "--log-level=warn"}
	if active {
		extra, stop, err := production(log, dir, "bench-footprint", pods)
		if err != nil {
			return err
		}
		defer stop()
		base = append(base, extra...)
	} else {
		base = append(base, "--container-runtime-endpoint=")
	}

	// 1. Footprint.
	log.Info("measuring the footprint", "duration", duration)
	rss, cpu, err := footprint(agentBin, append(slices.Clone(base), "--node-name=bench-footprint"), duration)
	if err != nil {
		return err
	}
	log.Info("footprint", "rss_mb", rss, "cpu_percent", cpu)

	// 2. Detection latency.
	// A round where the agent saw the pressure before the child crossed the threshold was crossed
	// by other processes on the host, not the child: it is run again, at most rounds times in all.
	var lat []float64
	retries := 0
	for i := 0; len(lat) < rounds; i++ {
		ms, err := detect(coord, agentBin, base, margin, i)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if ms < 0 {
			log.Warn("pressure seen before the child's crossing: the host crossed on its own; retrying", "round", i, "ms", ms)
			if retries++; retries > rounds {
				return errors.New("the host's memory is too noisy: too many rounds crossed without the child")
			}
			continue
		}
		log.Info("pressure detected", "round", i, "ms", ms)
		lat = append(lat, ms)
	}
	log.Info("detection rounds", "rounds", len(lat), "retried", retries)
	slices.Sort(lat)
	// A struct keeps the keys in the documented order.
	out, err := json.Marshal(struct {
		Bench string  `json:"bench"`
		RSS   float64 `json:"rss_mb"`
		CPU   float64 `json:"cpu_percent"`
		P50   float64 `json:"pressure_detect_ms_p50"`
		P99   float64 `json:"pressure_detect_ms_p99"`
	}{"agent", round(rss), round(cpu), round(percentile(lat, 0.50)), round(percentile(lat, 0.99))})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func startAgent(bin string, args []string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// footprint runs the agent for d after a short warm-up and returns its RSS in MiB (the highest
// seen) and its CPU use in percent of one core.
func footprint(bin string, args []string, d time.Duration) (rssMB, cpuPercent float64, err error) {
	cmd, err := startAgent(bin, args)
	if err != nil {
		return 0, 0, err
	}
	defer stop(cmd)
	pid := cmd.Process.Pid
	time.Sleep(3 * time.Second) // warm-up: connect, first samples
	cpu0, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var maxRSS int64
	var parts string
	for time.Since(start) < d {
		time.Sleep(time.Second)
		rss, err := rssKiB(pid)
		if err != nil {
			return 0, 0, fmt.Errorf("agent died? %w", err)
		}
		if rss > maxRSS {
			maxRSS, parts = rss, rssParts(pid)
		}
	}
	slog.Info("highest RSS", "kib", maxRSS, "parts", parts)
	cpu1, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	wall := time.Since(start).Seconds()
	const clkTck = 100 // sysconf(_SC_CLK_TCK) on Linux
	return float64(maxRSS) / 1024, float64(cpu1-cpu0) / clkTck / wall * 100, nil
}

func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command: state is field 3; utime 14, stime 15.
	s := string(data)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(rest) < 13 {
		return 0, errors.New("short /proc/pid/stat")
	}
	ut, err1 := strconv.ParseInt(rest[11], 10, 64)
	st, err2 := strconv.ParseInt(rest[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return ut + st, nil
}

// rssParts is the split of the RSS /proc/<pid>/status gives: anonymous memory (heap, stacks) and
// file pages (the binary's code and data touched so far).
func rssParts(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		for _, k := range []string{"RssAnon:", "RssFile:", "RssShmem:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				out = append(out, k+strings.Join(strings.Fields(v), ""))
			}
		}
	}
	return strings.Join(out, " ")
}

func rssKiB(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

// detect times one crossing.
func detect(coord *coordinator, bin string, base []string, margin int64, round int) (float64, error) {
	mem, err := signals.Reader{}.Memory()
	if err != nil {
		return 0, err
	}
	threshold := mem.Available - margin
	node := fmt.Sprintf("bench-detect-%d", round)
	args := append(slices.Clone(base), "--node-name="+node, fmt.Sprintf("--eviction-hard=memory.available<%d", threshold),
		"--eviction-pressure-transition-period=1s", "--nodefs-path=") // kubelet never reports a condition with a period of 0
	cmd, err := startAgent(bin, args)
	if err != nil {
		return 0, err
	}
	defer stop(cmd)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Wait for the agent's first MemoryPressure report (False).
	for {
		c, err := next(ctx, coord, node)
		if err != nil {
			return 0, fmt.Errorf("no initial condition: %w", err)
		}
		if c.cond.Type == agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE {
			if c.cond.Status == agentv1.ConditionStatus_CONDITION_STATUS_TRUE {
				return 0, errors.New("memory pressure before the allocation: memory.available moved; retry")
			}
			break
		}
	}
	// A random pause, so that the crossing falls at any phase of the agent's fast-path reads rather
	// than always at the same distance from its start.
	time.Sleep(time.Duration(rand.Int64N(int64(200 * time.Millisecond))))
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	child := exec.Command(self, fmt.Sprintf("--alloc=%d", threshold))
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := child.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	crossed := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if ns, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 64); err == nil {
				crossed <- time.Unix(0, ns)
				return
			}
		}
	}()
	var seen time.Time
	for {
		c, err := next(ctx, coord, node)
		if err != nil {
			now, _ := signals.Reader{}.Memory()
			return 0, fmt.Errorf("no MemoryPressure=True (threshold %d, memory.available now %d, agent exited: %v, child exited: %v): %w",
				threshold, now.Available, cmd.ProcessState, child.ProcessState, err)
		}
		if c.cond.Type == agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE && c.cond.Status == agentv1.ConditionStatus_CONDITION_STATUS_TRUE {
			seen = c.at
			break
		}
	}
	select {
	case at := <-crossed:
		return float64(seen.Sub(at).Microseconds()) / 1000, nil
	case <-ctx.Done():
		return 0, errors.New("the allocator never reported its crossing")
	}
}

func next(ctx context.Context, coord *coordinator, node string) (change, error) {
	for {
		select {
		case c := <-coord.changes:
			if c.nodeName == node {
				return c, nil
			}
		case <-ctx.Done():
			return change{}, ctx.Err()
		}
	}
}

// allocate is the child: it allocates and touches 4 MiB at a time until it reads memory.available
// below threshold, prints that instant (Unix ns) and holds the memory until killed. It gives up at
// 2 GiB.
func allocate(threshold int64) int {
	const chunk = 4 << 20
	var held [][]byte
	r := signals.Reader{}
	for total := 0; total < 2<<30; total += chunk {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		m, err := r.Memory()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if m.Available < threshold {
			fmt.Println(time.Now().UnixNano())
			// Go on 128 MiB past the threshold, so that other processes freeing memory do not
			// undo the crossing before the agent's next read, then hold until killed.
			for range 32 {
				b := make([]byte, chunk)
				for i := 0; i < len(b); i += 4096 {
					b[i] = 1
				}
				held = append(held, b)
			}
			select {}
		}
	}
	fmt.Fprintln(os.Stderr, "allocated 2 GiB without crossing the threshold", len(held))
	return 1
}

// production starts what the agent talks to on a production node besides the coordinator: a
// kube-apiserver (with etcd) holding pods bound to node, and containerd. It returns the agent's
// flags for them and a function that stops both.
func production(log *slog.Logger, dir, node string, pods int) (flags []string, stop func(), err error) {
	log.Info("starting etcd, kube-apiserver and containerd for the agent")
	kube, err := kubetest.New("")
	if err != nil {
		return nil, nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	ctd, err := containerdtest.New()
	if err != nil {
		kube.Stop()
		return nil, nil, fmt.Errorf("containerd: %w", err)
	}
	stop = func() { ctd.Stop(); kube.Stop() }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kube.Clientset()
	grace := int64(30)
	for i := range pods {
		_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", i), Labels: map[string]string{"app": "bench"}},
			Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("creating pod %d: %w", i, err)
		}
	}
	rc := kube.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["bench"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	kc.CurrentContext = "bench"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		stop()
		return nil, nil, err
	}
	return []string{"--kubeconfig=" + path, "--container-runtime-endpoint=" + ctd.Endpoint()}, stop, nil
}

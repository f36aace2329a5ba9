package engine

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/nodes"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the scenario scripts in testdata/")

// TestScenarios runs the scripts in testdata/*.txt. Each block is one command, a line "----", and
// the expected output up to a blank line. Commands:
//
//	config grace=40s startup=60s rate=0.1 secondary=0.01 large=50 threshold=0.55
//	       fence-timeout=1m max-unresponsive=50 budget=3 budget-window=10m settle=5s
//	       kube=true kubelet-policy=wait|fence allow-control-plane=true
//	add-nodes zone=a [region=r] n=10 [hello=false]  nodes a1..a10 say hello now (or never report)
//	configure a1..a3 [exclude=true] [control-plane=true]  those nodes have a fence configuration
//	                                       (fenceable), the exclude-disruption label, the control-plane role
//	silence a1..a6 | a1,a3                 those agents stop sending
//	resume a1..a6                          they send again
//	kubelet-silence a1 | kubelet-resume a1 kube=true: those kubelets stop (or resume) renewing their Lease
//	delete a3                              a3's Node is deleted
//	apiserver down | apiserver up          kube=true: the apiserver cannot (can again) be read
//	shutdown a3                            a3 announces a graceful shutdown
//	kdump-start a1 | kdump-stop a1         a1 sends fence_kdump messages every step (or stops)
//	tick 41s [step=1s]                     time passes; every non-silent agent sends a heartbeat each step
//	leader-change                          a new leader: a fresh engine restored from the persisted writes
//	pause | unpause                        an operator pauses or resumes evictions
//	zones | nodes                          print the current view
//	config pod-rate=0.1 pod-burst=1 pod-max-in-flight=2 pod-grant-ttl=2m   the pod-eviction budget
//	candidate a1 pod=ns/p [signal=memory.available]   a1 proposes evicting ns/p (uid ns/p)
//	report a1 pod=ns/p kind=granted|failed|declined|hard|fallback [uid-of=b1]   a1 reports an eviction
//	pod-zones                              print each zone's pod-eviction budget
//
// The fence flow (fence_scenario_test.go, each command with its handler there):
//
//	fence-plan a1..a3 power=bmc,pdu [isolation=fc] [recovery=fc-on] [required=pdu] [delay=7s] [random-delay=2s]
//	                                       those nodes' fence methods; from then on the engine's automatic
//	                                       fence requests for them print the record they create
//	fence-policy retries=2 backoff=10s isolation-wait=1m polls=3 poll-interval=10s
//	fence a1 | unfence a1                  an operator's fence or unfence
//	decide a1                              run the record until it waits for a driver or for time
//	driver a1 confirmed | failed [error=x] | state=unknown   the pending driver call's answer
//	ack a1 [caller=operator:alice|any] [operator=bob] [force=true] [reason=x]   an acknowledgement
//	disconnect a1..a3                      those agents' streams close
//	proof a1                               the proof verdict of a driver-confirmed power-off
//	fence-record a1                        print the node's latest record
func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenario scripts")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type harness struct {
	t       *testing.T
	cfg     Config
	e       *Engine
	start   time.Time
	now     time.Time
	silent  map[string]bool
	dumping map[string]bool
	kubelet map[string]time.Time  // kube=true: each node's latest Lease renewTime
	kdead   map[string]bool       // kube=true: kubelets that stopped renewing
	configs map[string]Configured // what configure declared, declared again to a new leader
	names   []string
	zoneOf  map[string][2]string  // node -> region, zone
	persist map[string]NodeRecord // what the loop would have written to etcd
	seq     uint64
	fence   *fenceFlow // the fence flow's records, from the first fence-plan on
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// The scripts count in a 40 s grace period (kube-controller-manager's default before 1.32);
	// DefaultConfig's 50 s is checked by TestDefaults.
	cfg := DefaultConfig()
	cfg.NodeMonitorGracePeriod = 40 * time.Second
	h := &harness{t: t, cfg: cfg, start: start, now: start, silent: map[string]bool{}, dumping: map[string]bool{}, kubelet: map[string]time.Time{}, kdead: map[string]bool{}, configs: map[string]Configured{}, persist: map[string]NodeRecord{}, zoneOf: map[string][2]string{}}
	h.e = New(h.cfg)
	h.e.Step(LeaderElected{At: start})
	var out strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	var failed bool
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		cmd := line
		if !sc.Scan() || sc.Text() != "----" {
			t.Fatalf("%s: command %q not followed by ----", path, cmd)
		}
		var want []string
		for sc.Scan() && sc.Text() != "" {
			want = append(want, sc.Text())
		}
		got := h.run(cmd)
		if len(got) == 0 {
			got = []string{"ok"}
		}
		if d := cmp.Diff(want, got); d != "" && !*rewrite {
			t.Errorf("%s: %s (-want +got):\n%s", path, cmd, d)
			failed = true
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n\n", cmd, strings.Join(got, "\n"))
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if failed {
		t.Log("run with -rewrite to accept the new output")
	}
}

func (h *harness) run(cmd string) []string {
	fields := strings.Fields(cmd)
	args := map[string]string{}
	var pos []string
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, f)
		}
	}
	switch fields[0] {
	case "config":
		for k, v := range args {
			switch k {
			case "grace":
				h.cfg.NodeMonitorGracePeriod = h.dur(v)
			case "startup":
				h.cfg.NodeStartupGracePeriod = h.dur(v)
			case "settle":
				h.cfg.Fence.Settle = h.dur(v)
			case "kube":
				h.cfg.KubeletWitness = v == "true"
			case "kubelet-policy":
				p, err := nodes.ParseKubeletDownPolicy(v)
				if err != nil {
					h.t.Fatal(err)
				}
				h.cfg.KubeletDownPolicy = p
			case "allow-control-plane":
				h.cfg.Fence.AllowControlPlane = v == "true"
			case "rate":
				h.cfg.NodeEvictionRate = h.float(v)
			case "secondary":
				h.cfg.SecondaryNodeEvictionRate = h.float(v)
			case "large":
				h.cfg.LargeClusterSizeThreshold = int(h.float(v))
			case "threshold":
				h.cfg.UnhealthyZoneThreshold = h.float(v)
			case "fence-timeout":
				h.cfg.Fence.Timeout = h.dur(v)
			case "max-unresponsive":
				h.cfg.Fence.MaxUnresponsivePercent = h.float(v)
			case "budget":
				h.cfg.Fence.Budget = int(h.float(v))
			case "budget-window":
				h.cfg.Fence.BudgetWindow = h.dur(v)
			case "pod-rate":
				h.cfg.PodEviction.Rate = h.float(v)
			case "pod-burst":
				h.cfg.PodEviction.Burst = int(h.float(v))
			case "pod-max-in-flight":
				h.cfg.PodEviction.MaxInFlight = int(h.float(v))
			case "pod-grant-ttl":
				h.cfg.PodEviction.GrantTTL = h.dur(v)
			default:
				h.t.Fatalf("config: unknown key %s", k)
			}
		}
		h.e = New(h.cfg)
		h.e.Step(LeaderElected{At: h.now})
		if h.cfg.KubeletWitness {
			h.e.Step(APIServer{Reachable: true, At: h.now})
		}
		h.drain()
		return nil
	case "add-nodes":
		n := int(h.float(args["n"]))
		for i := 1; i <= n; i++ {
			name := args["zone"] + strconv.Itoa(i)
			h.names = append(h.names, name)
			h.zoneOf[name] = [2]string{args["region"], args["zone"]}
			if args["hello"] == "false" {
				h.silent[name], h.kdead[name] = true, true
				h.e.Step(Configured{Node: name, Region: args["region"], Zone: args["zone"], At: h.now})
				continue
			}
			h.e.Step(Hello{Node: name, Region: args["region"], Zone: args["zone"], BootID: "b-" + name, At: h.now})
			if h.cfg.KubeletWitness {
				h.kubelet[name] = h.now
				h.e.Step(Kubelet{Node: name, Heartbeat: h.now, At: h.now})
			}
		}
		return h.drain()
	case "configure":
		for _, n := range h.expand(pos) {
			c := Configured{Node: n, Region: h.zoneOf[n][0], Zone: h.zoneOf[n][1], Fenceable: true,
				ExcludeDisruption: args["exclude"] == "true", ControlPlane: args["control-plane"] == "true", At: h.now}
			h.configs[n] = c
			h.e.Step(c)
		}
		return h.drain()
	case "kubelet-silence", "kubelet-resume":
		for _, n := range h.expand(pos) {
			h.kdead[n] = fields[0] == "kubelet-silence"
		}
		return nil
	case "delete":
		for _, n := range h.expand(pos) {
			h.e.Step(Removed{Node: n, At: h.now})
			h.silent[n], h.kdead[n] = true, true
			delete(h.zoneOf, n)
			delete(h.configs, n)
			h.names = slices.DeleteFunc(h.names, func(s string) bool { return s == n })
		}
		return h.drain()
	case "apiserver":
		h.e.Step(APIServer{Reachable: pos[0] == "up", At: h.now})
		if pos[0] == "up" {
			h.relist()
		}
		return h.drain()
	case "kdump-start", "kdump-stop":
		for _, n := range h.expand(pos) {
			h.dumping[n] = fields[0] == "kdump-start"
		}
		return nil
	case "silence", "resume":
		for _, n := range h.expand(pos) {
			h.silent[n] = fields[0] == "silence"
		}
		return nil
	case "shutdown":
		for _, n := range h.expand(pos) {
			h.send(n, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{
				Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, At: timestamppb.New(h.now)}}})
		}
		return h.drain()
	case "tick":
		step := time.Second
		if s, ok := args["step"]; ok {
			step = h.dur(s)
		}
		end := h.now.Add(h.dur(pos[0]))
		var out []string
		for h.now.Before(end) {
			h.now = h.now.Add(step)
			if h.now.After(end) {
				h.now = end
			}
			for _, n := range h.names {
				if !h.silent[n] {
					h.send(n, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}})
				}
				if h.cfg.KubeletWitness && !h.kdead[n] {
					h.kubelet[n] = h.now
					h.e.Step(Kubelet{Node: n, Heartbeat: h.now, At: h.now})
				}
				if h.dumping[n] {
					h.e.Step(Kdump{Node: n, At: h.now})
				}
			}
			h.e.Tick(h.now)
			out = append(out, h.drain()...)
		}
		return out
	case "leader-change":
		var recs []NodeRecord
		for _, r := range h.persist {
			recs = append(recs, r)
		}
		sort.Slice(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
		if h.fence != nil {
			h.fence.epoch++ // the records stay: they are in etcd
		}
		h.e = New(h.cfg)
		h.e.Step(LeaderElected{At: h.now})
		h.e.Step(Restored{Nodes: recs})
		for _, n := range h.names {
			if c, ok := h.configs[n]; ok {
				c.At = h.now
				h.e.Step(c)
			}
		}
		if h.cfg.KubeletWitness {
			h.e.Step(APIServer{Reachable: true, At: h.now})
			h.relist()
		}
		for _, n := range h.names {
			if !h.silent[n] {
				h.e.Step(Hello{Node: n, Region: h.zoneOf[n][0], Zone: h.zoneOf[n][1], BootID: "b-" + n, At: h.now})
			}
		}
		return append([]string{fmt.Sprintf("t=%s new leader; restored %d node records", h.elapsed(), len(recs))}, h.drain()...)
	case "pause", "unpause":
		h.e.Step(Paused{Paused: fields[0] == "pause"})
		return h.drain()
	case "candidate":
		return h.handleCandidate(pos, args)
	case "report":
		return h.handleReport(pos, args)
	case "pod-zones":
		return h.handlePodZones()
	case "fence-plan": // fence-plan a1..a3 power=bmc,pdu [isolation=fc] [recovery=fc-on] [required=pdu] [delay=7s]
		return h.handleFencePlan(pos, args)
	case "fence-policy": // fence-policy retries=2 backoff=10s isolation-wait=1m polls=3 poll-interval=10s
		return h.handleFencePolicy(args)
	case "fence", "unfence": // fence a1 | unfence a1
		return h.handleFence(fields[0], pos)
	case "decide": // decide a1
		return h.handleDecide(pos)
	case "driver": // driver a1 confirmed | driver a1 failed [error=timeout] | driver a1 state=unknown
		return h.handleDriver(pos, args)
	case "ack": // ack a1 [caller=operator:alice|any] [operator=bob] [force=true] [reason=pulled-the-plug]
		return h.handleAck(pos, args)
	case "disconnect": // disconnect a1..a3
		return h.handleDisconnect(pos)
	case "proof": // proof a1
		return h.handleProof(pos)
	case "fence-record": // fence-record a1
		return h.handleFenceRecord(pos)
	case "zones":
		var out []string
		for _, z := range h.e.Zones() {
			out = append(out, fmt.Sprintf("zone %s: %s size=%d ready=%d notReady=%d rate=%g queue=%d",
				z.Key, word(z.State), z.Size, z.Ready, z.NotReady, z.EvictionRate, z.QueueLength))
		}
		if h.e.Halted() {
			out = append(out, "halted")
		}
		return out
	case "nodes":
		var out []string
		for _, n := range h.e.Nodes() {
			line := fmt.Sprintf("%s: %s", n.Name, word(n.Readiness))
			if n.AgentDown {
				line += " (agent down)"
			}
			if n.KubeletDown {
				line += " (kubelet down)"
			}
			out = append(out, line)
		}
		return out
	}
	h.t.Fatalf("unknown command %q", cmd)
	return nil
}

// relist is what the informers deliver after a (re)start: every Node's Lease as it is now.
func (h *harness) relist() {
	for _, n := range h.names {
		if beat, ok := h.kubelet[n]; ok {
			h.e.Step(Kubelet{Node: n, Heartbeat: beat, At: h.now})
		}
	}
}

func (h *harness) send(node string, m *agentv1.ConnectRequest) {
	h.seq++
	m.Seq = h.seq
	h.e.Step(Message{Node: node, At: h.now, Msg: m})
}

// drain applies Ready the way the loop does (persist, then report) and returns the events.
func (h *harness) drain() []string {
	rd := h.e.Ready()
	for _, w := range rd.Writes {
		if w.Node != nil {
			h.persist[w.Node.Name] = *w.Node
		}
		if w.Forget != "" {
			delete(h.persist, w.Forget)
		}
	}
	var out []string
	for _, ev := range rd.Events {
		out = append(out, fmt.Sprintf("t=%s %s", ev.At.Sub(h.start), ev.Text))
	}
	out = append(out, h.autoFences(rd.Fences)...)
	for _, g := range rd.Grants {
		for _, p := range g.Grant.Pods {
			out = append(out, fmt.Sprintf("grant -> %s: %s/%s (%s)", g.Node, p.Namespace, p.Name, g.Grant.Signal))
		}
	}
	h.e.Advance()
	return out
}

func (h *harness) elapsed() time.Duration { return h.now.Sub(h.start) }

// expand turns "a1..a6" and "a1,a3" into names.
func (h *harness) expand(args []string) []string {
	var out []string
	for _, a := range args {
		for _, part := range strings.Split(a, ",") {
			from, to, ok := strings.Cut(part, "..")
			if !ok {
				out = append(out, part)
				continue
			}
			prefix := strings.TrimRight(from, "0123456789")
			lo, _ := strconv.Atoi(from[len(prefix):])
			hi, _ := strconv.Atoi(strings.TrimPrefix(to, prefix))
			for i := lo; i <= hi; i++ {
				out = append(out, prefix+strconv.Itoa(i))
			}
		}
	}
	return out
}

func (h *harness) dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

func (h *harness) float(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		h.t.Fatal(err)
	}
	return f
}

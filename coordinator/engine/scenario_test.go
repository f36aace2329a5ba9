package engine

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the scenario scripts in testdata/")

// TestScenarios runs the scripts in testdata/*.txt. Each block is one command, a line "----", and
// the expected output up to a blank line. Commands:
//
//	config grace=40s startup=60s rate=0.1 secondary=0.01 large=50 threshold=0.55
//	       fence-timeout=1m max-unresponsive=50 budget=3 budget-window=10m settle=5s
//	       detect=grace|witnesses kube=true kubelet-policy=wait|fence allow-control-plane=true kdump-idle=30s kdump-timeout=10m
//	       fence-mode=enforce|observe
//	add-nodes zone=a [region=r] n=10 [hello=false]  nodes a1..a10 say hello now (or never report)
//	configure a1..a3 [exclude=true] [control-plane=true] [observe=true] [exclude-fencing=true]
//	                                       those nodes have a fence configuration (fenceable), the
//	                                       exclude-disruption label, the control-plane role, the
//	                                       fence-mode annotation observe, the exclude-from-fencing label
//	silence a1..a6 | a1,a3                 those agents stop sending
//	resume a1..a6                          they send again
//	kubelet-silence a1 | kubelet-resume a1 kube=true: those kubelets stop (or resume) renewing their Lease
//	delete a3                              a3's Node is deleted
//	apiserver down | apiserver up          kube=true: the apiserver cannot (can again) be read
//	shutdown a3                            a3 announces a graceful shutdown
//	kdump-start a1 | kdump-stop a1         a1 sends fence_kdump messages every step (or stops)
//	tick 41s [step=1s]                     time passes; every non-silent agent sends a heartbeat each step
//	leader-change [fence-mode=enforce]     a new leader: a fresh engine restored from the persisted writes
//	                                       (with fence-mode: a restart with --fence-mode changed)
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
//	proof a1                               the engine's proof verdict on a driver-confirmed power-off
//	fence-record a1                        print the node's latest record
//	release a1 [tainted=true] [node-ready=1m] [healthy-delay=1m]   one pass of the release reconciler
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
	fence   *fenceFlow     // the fence flow's records, from the first fence-plan on
	boots   map[string]int // boots after the first, per node (boot)
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// The scripts count in a 40 s grace period (kube-controller-manager's default before 1.32);
	// DefaultConfig's 50 s is checked by TestDefaults.
	// They were written for the grace detection and a one-minute fence timeout (the defaults
	// before fast detection); scripts of the witnesses' detection say detect=witnesses.
	cfg := DefaultConfig()
	cfg.NodeMonitorGracePeriod = 40 * time.Second
	cfg.Fence.Detect, cfg.Fence.Timeout = DetectGrace, time.Minute
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

// run dispatches one command line to its handler; each handler documents its command.
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
	case "config": // config grace=40s fence-timeout=1m kube=true ...
		return h.handleConfig(args)
	case "add-nodes": // add-nodes zone=a [region=r] n=10 [hello=false]
		return h.handleAddNodes(args)
	case "configure": // configure a1..a3 [exclude=true] [control-plane=true] [observe=true] [exclude-fencing=true]
		return h.handleConfigure(pos, args)
	case "kubelet-silence", "kubelet-resume": // kubelet-silence a1 | kubelet-resume a1
		return h.handleKubelet(fields[0], pos)
	case "delete": // delete a3
		return h.handleDelete(pos)
	case "apiserver": // apiserver down | apiserver up
		return h.handleAPIServer(pos)
	case "kdump-start", "kdump-stop": // kdump-start a1 | kdump-stop a1
		return h.handleKdump(fields[0], pos)
	case "silence", "resume": // silence a1..a6 | resume a1,a3
		return h.handleSilence(fields[0], pos)
	case "boot": // boot a1: its agent says hello from a new boot and reports again
		return h.handleBoot(pos)
	case "shutdown": // shutdown a3
		return h.handleShutdown(pos)
	case "tick": // tick 41s [step=1s]
		return h.handleTick(pos, args)
	case "leader-change": // leader-change [fence-mode=enforce]
		return h.handleLeaderChange(args)
	case "pause", "unpause": // pause | unpause
		return h.handlePause(fields[0])
	case "candidate": // candidate a1 pod=ns/p [signal=memory.available]
		return h.handleCandidate(pos, args)
	case "report": // report a1 pod=ns/p kind=granted|failed|declined|hard|fallback [uid-of=b1]
		return h.handleReport(pos, args)
	case "pod-zones": // pod-zones
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
	case "release": // release a1 [tainted=true] [node-ready=1m] [healthy-delay=1m]
		return h.handleRelease(pos, args)
	case "zones": // zones
		return h.handleZones()
	case "nodes": // nodes
		return h.handleNodes()
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
		text := ev.Text
		if ev.Kind == "proof" || ev.Kind == "alarm" {
			text = h.relative(text)
		}
		out = append(out, fmt.Sprintf("t=%s %s", ev.At.Sub(h.start), text))
	}
	out = append(out, h.autoFences(rd.Fences)...)
	for _, g := range rd.Grants {
		for _, p := range g.Grant.Pods {
			out = append(out, fmt.Sprintf("grant -> %s: %s/%s (%s)", g.Node, p.Namespace, p.Name, g.Grant.Signal))
		}
	}
	h.e.Advance()
	h.alarms(rd.Proofs)
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

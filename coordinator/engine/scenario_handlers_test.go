package engine

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/nodes"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// The handlers of the scenario commands on nodes, agents, kubelets and time (TestScenarios lists
// them all; pods_scenario_test.go and fence_scenario_test.go hold the others).

// handleConfig sets the engine configuration (the keys are listed at TestScenarios) and starts a
// fresh engine with it, elected now.
//
//	config grace=40s fence-timeout=1m kube=true ...
func (h *harness) handleConfig(args map[string]string) []string {
	for k, v := range args {
		switch k {
		case "grace":
			h.cfg.NodeMonitorGracePeriod = h.dur(v)
		case "startup":
			h.cfg.NodeStartupGracePeriod = h.dur(v)
		case "settle":
			h.cfg.Fence.Settle = h.dur(v)
		case "kdump-idle":
			h.cfg.KdumpIdle = h.dur(v)
		case "kdump-timeout":
			h.cfg.KdumpTimeout = h.dur(v)
		case "kube":
			h.cfg.KubeletWitness = v == "true"
		case "kubelet-policy":
			p, err := nodes.ParseKubeletDownPolicy(v)
			if err != nil {
				h.t.Fatal(err)
			}
			h.cfg.KubeletDownPolicy = p
		case "detect":
			d, err := ParseFenceDetect(v)
			if err != nil {
				h.t.Fatal(err)
			}
			h.cfg.Fence.Detect = d
		case "fence-mode":
			m, err := ParseFenceMode(v)
			if err != nil {
				h.t.Fatal(err)
			}
			h.cfg.Fence.Mode = m
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
		case "storm-cooldown":
			h.cfg.Fence.StormCooldown = h.dur(v)
		case "flap-window":
			h.cfg.Fence.FlapWindow = h.dur(v)
		case "unhealthy-condition":
			t, err := ParseConditionTrigger(v)
			if err != nil {
				h.t.Fatal(err)
			}
			h.cfg.UnhealthyConditions = append(h.cfg.UnhealthyConditions, t)
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
}

// handleAddNodes adds n nodes of a zone: each agent says hello now (and, with kube=true, each kubelet renews
// its Lease), or with hello=false never reports (the node is only configured).
//
//	add-nodes zone=a [region=r] n=10 [hello=false]
func (h *harness) handleAddNodes(args map[string]string) []string {
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
}

// handleConfigure gives nodes a fence configuration (fenceable), the exclude-disruption label, the
// control-plane role, the fence-mode annotation (observe) or the exclude-from-fencing label. Each
// configure declares the node anew: what it does not say is off.
//
//	configure a1..a3 [exclude=true] [control-plane=true] [observe=true] [exclude-fencing=true]
func (h *harness) handleConfigure(pos []string, args map[string]string) []string {
	for _, n := range h.expand(pos) {
		c := Configured{Node: n, Region: h.zoneOf[n][0], Zone: h.zoneOf[n][1], Fenceable: true,
			ExcludeDisruption: args["exclude"] == "true", ControlPlane: args["control-plane"] == "true",
			Observe: args["observe"] == "true", ExcludeFencing: args["exclude-fencing"] == "true", At: h.now}
		c.Maintenance = strings.ReplaceAll(args["maintenance"], "_", " ")
		if typ, status, ok := strings.Cut(args["condition"], "="); ok {
			c.Conditions = map[string]string{typ: status}
		}
		h.configs[n] = c
		h.e.Step(c)
	}
	return h.drain()
}

// handleKubelet stops (or resumes) those kubelets' Lease renewals (kube=true).
//
//	kubelet-silence a1 | kubelet-resume a1
func (h *harness) handleKubelet(cmd string, pos []string) []string {
	return h.mark(h.kdead, pos, cmd == "kubelet-silence")
}

// handleDelete deletes the nodes' Node objects: the engine forgets them.
//
//	delete a3
func (h *harness) handleDelete(pos []string) []string {
	for _, n := range h.expand(pos) {
		h.e.Step(Removed{Node: n, At: h.now})
		h.silent[n], h.kdead[n] = true, true
		delete(h.zoneOf, n)
		delete(h.configs, n)
		h.names = slices.DeleteFunc(h.names, func(s string) bool { return s == n })
	}
	return h.drain()
}

// handleAPIServer makes the apiserver unreadable or readable again; readable again, the informers relist.
//
//	apiserver down | apiserver up
func (h *harness) handleAPIServer(pos []string) []string {
	h.e.Step(APIServer{Reachable: pos[0] == "up", At: h.now})
	if pos[0] == "up" {
		h.relist()
	}
	return h.drain()
}

// handleKdump starts (or stops) fence_kdump messages from those nodes, one every tick step.
//
//	kdump-start a1 | kdump-stop a1
func (h *harness) handleKdump(cmd string, pos []string) []string {
	return h.mark(h.dumping, pos, cmd == "kdump-start")
}

// handleSilence stops (or resumes) those agents' heartbeats; their streams stay open.
//
//	silence a1..a6 | resume a1,a3
func (h *harness) handleSilence(cmd string, pos []string) []string {
	return h.mark(h.silent, pos, cmd == "silence")
}

// handleBoot has those nodes boot again: each agent says hello from a new boot id and reports
// from then on.
//
//	boot a1
func (h *harness) handleBoot(pos []string) []string {
	if h.boots == nil {
		h.boots = map[string]int{}
	}
	for _, n := range h.expand(pos) {
		h.boots[n]++
		h.silent[n] = false
		h.e.Step(Hello{Node: n, Region: h.zoneOf[n][0], Zone: h.zoneOf[n][1], BootID: fmt.Sprintf("b-%s-%d", n, h.boots[n]), At: h.now})
	}
	return h.drain()
}

// handleShutdown has those agents announce a graceful shutdown.
//
//	shutdown a3
func (h *harness) handleShutdown(pos []string) []string {
	for _, n := range h.expand(pos) {
		h.send(n, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{
			Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, At: timestamppb.New(h.now)}}})
	}
	return h.drain()
}

// handleTick lets time pass in steps: every non-silent agent sends a heartbeat, every live kubelet renews
// its Lease and every dumping node sends a fence_kdump message each step; the engine ticks.
//
//	tick 41s [step=1s]
func (h *harness) handleTick(pos []string, args map[string]string) []string {
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
}

// handleLeaderChange is a failover: a fresh engine restored from the persisted node records, the configured
// nodes declared again, the live agents saying hello to it. With fence-mode, the new leader is a
// coordinator restarted with --fence-mode changed.
//
//	leader-change [fence-mode=enforce|observe]
func (h *harness) handleLeaderChange(args map[string]string) []string {
	if v, ok := args["fence-mode"]; ok {
		m, err := ParseFenceMode(v)
		if err != nil {
			h.t.Fatal(err)
		}
		h.cfg.Fence.Mode = m
	}
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
	if h.fence != nil {
		// The new term reads every node's newest record (coordinator/app's standingRecords).
		for _, n := range h.names {
			if r := h.fence.records[n]; r != nil {
				h.e.Step(FenceRecord{Record: r, At: h.now})
			}
		}
	}
	for _, n := range h.names {
		if !h.silent[n] {
			h.e.Step(Hello{Node: n, Region: h.zoneOf[n][0], Zone: h.zoneOf[n][1], BootID: "b-" + n, At: h.now})
		}
	}
	return append([]string{fmt.Sprintf("t=%s new leader; restored %d node records", h.elapsed(), len(recs))}, h.drain()...)
}

// handlePause is an operator pausing or resuming evictions.
//
//	pause | unpause
func (h *harness) handlePause(cmd string) []string {
	h.e.Step(Paused{Paused: cmd == "pause"})
	return h.drain()
}

// handleZones prints every zone's state and pacing, and whether the engine halted.
//
//	zones
func (h *harness) handleZones() []string {
	var out []string
	for _, z := range h.e.Zones() {
		out = append(out, fmt.Sprintf("zone %s: %s size=%d ready=%d notReady=%d rate=%g queue=%d",
			z.Key, word(z.State), z.Size, z.Ready, z.NotReady, z.EvictionRate, z.QueueLength))
	}
	if h.e.Halted() {
		out = append(out, "halted")
	}
	return out
}

// handleNodes prints every node's readiness.
//
//	nodes
func (h *harness) handleNodes() []string {
	var out []string
	for _, n := range h.e.Nodes() {
		line := fmt.Sprintf("%s: %s", n.Name, word(n.Readiness))
		if n.AgentDown {
			line += " (agent down)"
		}
		if n.KubeletDown {
			line += " (kubelet down)"
		}
		if n.SilentSince != nil {
			line += " (silent since " + n.SilentSince.AsTime().Sub(h.start).String() + ")"
		}
		if n.Observed {
			line += " (observe mode)"
		}
		if n.WouldFence {
			line += " (would fence)"
		}
		if n.ExcludedFromFencing {
			line += " (excluded from fencing)"
		}
		out = append(out, line)
	}
	return out
}

// mark sets (or clears) a per-node flag of the named nodes.
func (h *harness) mark(flag map[string]bool, pos []string, on bool) []string {
	for _, n := range h.expand(pos) {
		flag[n] = on
	}
	return nil
}

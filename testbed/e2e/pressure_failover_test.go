package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/pressure"
	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/wait"
)

// lowMemory is a pressure.Reader whose memory.available stays at 900 MiB of 8 GiB.
type lowMemory struct{}

func (lowMemory) Read() ([]*agentv1.Signal, error) {
	return []*agentv1.Signal{{Name: eviction.SignalMemoryAvailable, Available: 900 << 20, Capacity: 8 << 30}}, nil
}

func (lowMemory) Memory() (signals.Memory, error) {
	return signals.Memory{Available: 900 << 20, Capacity: 8 << 30}, nil
}

type onePod []eviction.Pod

func (p onePod) Pods(context.Context) ([]eviction.Pod, error) { return p, nil }

// localKills counts the monitor's local evictions (the fallback), which must not happen here.
type localKills struct{ n atomic.Int32 }

func (k *localKills) Kill(context.Context, eviction.Candidate, eviction.Reclaim) (string, error) {
	k.n.Add(1)
	return "fallback", nil
}

func (k *localKills) CleanedUp(context.Context, eviction.Candidate) bool { return false }

// A soft-threshold candidate the leader has acknowledged but not granted (evictions paused) lives
// only in that leader's memory. The leader dies; the agent's next stream goes to the new leader and
// its pressure monitor proposes the candidate again, so once evictions resume the new leader grants
// it - long before the agent's grant timeout would have evicted locally.
func TestPendingCandidateFollowsTheLeader(t *testing.T) {
	n := node{name: "f-1", password: "password", bmc: startBMC(t, "f-1")}
	driver := startDriver(t, t.TempDir())
	cfgPath := writeConfig(t, driver, []node{n})
	eng := engine.DefaultConfig()
	eng.Fence.Enabled = false
	eng.PodEviction = engine.PodEvictionConfig{Rate: 10, Burst: 1, MaxInFlight: 1, GrantTTL: time.Minute}
	cfg := app.Config{FenceConfig: cfgPath, Engine: eng, AgentHeartbeatInterval: 2 * time.Second, AgentSampleInterval: 2 * time.Second}
	cfg.ID = "first"
	first := startCoordinator(t, cfg)
	firstConn := conn(t, first.app.Addr())
	leaderReady(t, firstConn)
	cfg.ID, cfg.EtcdEndpoints, cfg.EtcdAccess = "second", []string{first.app.EtcdEndpoint()}, first.app.EtcdAccess()
	second := startCoordinator(t, cfg)
	secondConn := conn(t, second.app.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := coordv1.NewClusterServiceClient(firstConn).PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: "test: hold the candidate"}); err != nil {
		t.Fatal(err)
	}

	// The agent and its pressure monitor, wired as the node-agent binary wires them.
	var mon atomic.Pointer[pressure.Monitor]
	granted := &grantLog{}
	relay := grantFunc(func(g *agentv1.EvictionGrant) {
		if m := mon.Load(); m != nil {
			m.Grant(g)
		}
	})
	a, err := agent.New(agent.Config{Coordinators: []string{first.app.Addr(), second.app.Addr()}, TLS: tlsAs(t, identity.Agent, n.name), NodeName: n.name,
		BootID: "b-" + n.name, Zone: "a", Grants: relay, Log: testLog(t),
		Connected: func() {
			if m := mon.Load(); m != nil {
				m.Connected()
			}
		}}, fixedSampler{})
	if err != nil {
		t.Fatal(err)
	}
	evCfg, errs := eviction.Parse(eviction.Flags{HardSet: true, Hard: "memory.available<100Mi", Soft: "memory.available<1Gi",
		SoftGracePeriod: "memory.available=1s", MaxPodGracePeriod: 5, PressureTransitionPeriod: time.Minute})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	kills := &localKills{}
	m, err := pressure.New(pressure.Config{Eviction: evCfg, HousekeepingInterval: 200 * time.Millisecond, FastInterval: -1,
		GrantTimeout: 10 * time.Minute, Log: slog.New(slog.DiscardHandler),
		Actions: pressure.Actions{Killer: kills, Cleanup: kills, Granted: granted}},
		lowMemory{}, a, onePod{{Namespace: "web", Name: "hog", UID: "uid-hog", GracePeriod: 30 * time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mon.Store(m)
	runCtx, stop := context.WithCancel(context.Background())
	doneA, doneM := make(chan struct{}), make(chan struct{})
	go func() { defer close(doneA); a.Run(runCtx) }()
	go func() { defer close(doneM); m.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-doneA; <-doneM })

	held := func(cc *coordv1.ClusterServiceClient) func() error {
		return func() error {
			r, err := (*cc).ListZones(ctx, &coordv1.ListZonesRequest{})
			if err != nil {
				return err
			}
			for _, z := range r.Zones {
				if z.PodCandidatesHeld == 1 {
					return nil
				}
			}
			return fmt.Errorf("no candidate held: %v", r.Zones)
		}
	}
	firstCl := coordv1.NewClusterServiceClient(firstConn)
	wait.Until(t, 20*time.Second, "the first leader holds the candidate", held(&firstCl))
	wait.Until(t, 20*time.Second, "the agent has nothing unacknowledged", func() error {
		if u := a.Unacked(); u > 0 {
			return fmt.Errorf("%d unacked", u)
		}
		return nil
	})
	if g := granted.list(); len(g) != 0 {
		t.Fatalf("grants while evictions are paused: %v", g)
	}

	// The first leader dies without resigning.
	wait.Until(t, 10*time.Second, "second campaigning", func() error {
		r, err := first.app.Etcd().Get(ctx, first.app.Store().LeaderPrefix()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if r.Count != 2 {
			return fmt.Errorf("%d election keys", r.Count)
		}
		return nil
	})
	abandonTo(t, first, second, 60*time.Second)
	secondCl := coordv1.NewClusterServiceClient(secondConn)
	wait.Until(t, 30*time.Second, "the new leader holds the candidate", held(&secondCl))
	if _, err := secondCl.ResumeEvictions(ctx, &coordv1.ResumeEvictionsRequest{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 20*time.Second, "the new leader grants the candidate", func() error {
		if g := granted.list(); len(g) == 0 || g[0] != "web/hog" {
			return fmt.Errorf("grants %v", g)
		}
		return nil
	})
	if k := kills.n.Load(); k != 0 {
		t.Errorf("%d local evictions; want the grant", k)
	}
}

// grantFunc adapts a function to agent.GrantHandler.
type grantFunc func(*agentv1.EvictionGrant)

func (f grantFunc) Grant(g *agentv1.EvictionGrant) { f(g) }

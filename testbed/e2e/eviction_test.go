package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// grantLog records the grants an agent receives.
type grantLog struct {
	mu  sync.Mutex
	got []string
}

func (g *grantLog) Grant(e *agentv1.EvictionGrant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range e.Pods {
		g.got = append(g.got, p.Namespace+"/"+p.Name)
	}
}

func (g *grantLog) list() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.got)
}

// Three nodes of one zone propose soft-threshold evictions at once: the coordinator grants over
// the agents' streams under the zone's budget (one in flight, a token every 2 s), visible in
// ListZones; a report frees the slot.
func TestPodEvictionsPacedPerZone(t *testing.T) {
	names := []string{"p-1", "p-2", "p-3"}
	var configured []node // only configured nodes may say hello
	for _, name := range names {
		configured = append(configured, node{name: name, password: "password", bmc: startBMC(t, name)})
	}
	driver := startDriver(t, t.TempDir())
	eng := engine.DefaultConfig()
	eng.Fence.Enabled = false
	eng.PodEviction = engine.PodEvictionConfig{Rate: 0.5, Burst: 1, MaxInFlight: 1, GrantTTL: time.Minute}
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, configured), Engine: eng,
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	cl := coordv1.NewClusterServiceClient(cc)

	agents := map[string]*agent.Agent{}
	grants := map[string]*grantLog{}
	for _, name := range names {
		grants[name] = &grantLog{}
		a, err := agent.New(agent.Config{Coordinators: []string{c.app.Addr()}, TLS: tlsAs(t, identity.Agent, name), NodeName: name, BootID: "b-" + name,
			Zone: "a", Grants: grants[name], Log: testLog(t)}, fixedSampler{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		agents[name] = a
	}
	zone := func() *coordv1.Zone {
		r, err := cl.ListZones(context.Background(), &coordv1.ListZonesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range r.Zones {
			if z.Size == 3 {
				return z
			}
		}
		return &coordv1.Zone{}
	}
	wait.Until(t, 10*time.Second, "three agents connected", func() error {
		if z := zone(); z.Size != 3 || z.Ready != 3 {
			return fmt.Errorf("%v", z)
		}
		return nil
	})
	for _, name := range names {
		agents[name].Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Candidates{Candidates: &agentv1.EvictionCandidates{
			Signal: "memory.available", Candidates: []*agentv1.EvictionCandidate{{Namespace: "web", Name: "hog-" + name, Uid: "uid-" + name}}}}})
	}
	total := func() (n int, who string) {
		for _, name := range names {
			if g := grants[name].list(); len(g) > 0 {
				n += len(g)
				who = name
			}
		}
		return n, who
	}
	var first string
	wait.Until(t, 5*time.Second, "one grant", func() error {
		n, who := total()
		if n != 1 {
			return fmt.Errorf("%d grants", n)
		}
		first = who
		return nil
	})
	wait.Until(t, 5*time.Second, "ListZones shows the budget", func() error {
		if z := zone(); z.PodEvictionsInFlight != 1 || z.PodEvictionsMaxInFlight != 1 || z.PodCandidatesHeld != 2 || z.PodEvictionsGranted != 1 || z.PodEvictionRate != 0.5 {
			return fmt.Errorf("%v", z)
		}
		return nil
	})
	// The cap holds the others back even when tokens are there.
	time.Sleep(2500 * time.Millisecond)
	if n, _ := total(); n != 1 {
		t.Fatalf("%d grants with one in flight and a cap of 1", n)
	}
	agents[first].Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
		Namespace: "web", Name: "hog-" + first, Uid: "uid-" + first, Signal: "memory.available", Kind: agentv1.EvictionKind_EVICTION_KIND_GRANTED}}})
	wait.Until(t, 5*time.Second, "a second grant after the report", func() error {
		if n, _ := total(); n != 2 {
			return fmt.Errorf("%d grants", n)
		}
		return nil
	})
	if z := zone(); z.PodCandidatesHeld != 1 || z.PodEvictionsGranted != 2 {
		t.Fatalf("zone after the second grant: %v", z)
	}
}

package engine

import (
	"sort"
	"strconv"
	"testing"
	"testing/quick"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// The incrementally kept node order equals sorting all names at once.
func TestNodeOrderMatchesFullSort(t *testing.T) {
	f := func(ids []uint16) bool {
		e := New(DefaultConfig())
		var names []string
		seen := map[string]bool{}
		for _, id := range ids {
			name := "n" + string(rune('a'+id%3)) + strconv.Itoa(int(id%200))
			e.Step(Hello{Node: name, Zone: "z", At: time.Unix(0, 0)})
			if !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
		sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
		got := e.order
		if len(got) != len(names) {
			return false
		}
		for i := range got {
			if got[i].name != names[i] {
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, nil); err != nil {
		t.Fatal(err)
	}
	if !naturalLess("a2", "a10") || naturalLess("a10", "a2") || !naturalLess("a", "a1") || naturalLess("b1", "a2") {
		t.Fatal("naturalLess ordering is wrong")
	}
}

// TestDefaults pins kube-controller-manager's defaults (nodelifecycle/config/v1alpha1/defaults.go).
func TestDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.NodeMonitorGracePeriod != 50*time.Second || c.NodeStartupGracePeriod != time.Minute ||
		c.NodeEvictionRate != 0.1 || c.SecondaryNodeEvictionRate != 0.01 || c.LargeClusterSizeThreshold != 50 || c.UnhealthyZoneThreshold != 0.55 {
		t.Errorf("defaults differ from kube-controller-manager's: %+v", c)
	}
}

// FenceRefusal refuses to fence the last ready control-plane node, whoever asks.
func TestFenceRefusal(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := New(DefaultConfig())
	e.Step(LeaderElected{At: start})
	for _, n := range []string{"cp1", "cp2", "w1"} {
		e.Step(Hello{Node: n, Zone: "z", At: start})
		e.Step(Configured{Node: n, Zone: "z", Fenceable: true, ControlPlane: n != "w1", At: start})
	}
	e.Tick(start.Add(time.Second))
	if why := e.FenceRefusal("cp1"); why != "" {
		t.Errorf("cp1 with cp2 ready refused: %s", why)
	}
	if why := e.FenceRefusal("w1"); why != "" {
		t.Errorf("a worker refused: %s", why)
	}
	// cp2 goes silent: cp1 is the last ready member.
	for s := 2; s <= 60; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		e.Step(Message{Node: "cp1", At: now, Msg: &agentv1.ConnectRequest{}})
		e.Step(Message{Node: "w1", At: now, Msg: &agentv1.ConnectRequest{}})
		e.Tick(now)
		e.Advance()
	}
	if why := e.FenceRefusal("cp1"); why == "" {
		t.Error("the last ready control-plane node was not refused")
	}
}

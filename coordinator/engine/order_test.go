package engine

import (
	"sort"
	"strconv"
	"testing"
	"testing/quick"
	"time"
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

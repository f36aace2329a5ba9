package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A node that moves between zones is counted in its new zone by the next Tick, also when its old
// zone emptied and was made again (the node keeps a pointer to its zone for the Tick).
func TestZoneMoveCountedInNewZone(t *testing.T) {
	e := New(DefaultConfig())
	now := time.Unix(1_700_000_000, 0)
	e.Step(LeaderElected{At: now})
	hello := func(node, zone string) {
		e.Step(Hello{Node: node, Zone: zone, BootID: "b", At: now})
	}
	sizes := func() string {
		e.Tick(now)
		e.Advance()
		var s []string
		for _, z := range e.Zones() {
			s = append(s, fmt.Sprintf("%s=%d", z.Key, z.Size))
		}
		return strings.Join(s, " ")
	}
	hello("x", "a")
	hello("y", "a")
	if got := sizes(); got != "/a=2" {
		t.Fatalf("both in a: %q", got)
	}
	hello("x", "b")
	if got := sizes(); got != "/a=1 /b=1" {
		t.Fatalf("x moved to b: %q", got)
	}
	hello("y", "b") // a empties and is removed
	hello("x", "a") // and made again
	if got := sizes(); got != "/a=1 /b=1" {
		t.Fatalf("x back in a new a: %q", got)
	}
}

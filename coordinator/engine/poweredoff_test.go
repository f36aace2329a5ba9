package engine

import (
	"strings"
	"testing"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A node a fence confirmed off reads as powered off at once, while its readiness keeps the grace
// period's judgement; it reads as before once its agent says hello again, and a later version of
// the same record (an older confirmation) does not bring the mark back.
func TestPoweredOffView(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := New(DefaultConfig())
	e.Step(LeaderElected{At: start})
	e.Step(Configured{Node: "n1", Zone: "z", Fenceable: true, At: start})
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b1", At: start})
	e.Tick(start.Add(time.Second))
	if n := e.Node("n1"); n.Readiness != coordv1.Readiness_READINESS_READY || strings.Contains(n.Reason, "powered off") {
		t.Fatalf("before the fence: %v %q", n.Readiness, n.Reason)
	}
	off := start.Add(2 * time.Second)
	e.Step(Disconnected{Node: "n1"})
	e.Step(PoweredOff{Node: "n1", Fence: "f1", At: off})
	e.Tick(off)
	n := e.Node("n1")
	if n.Readiness != coordv1.Readiness_READINESS_READY || !strings.HasPrefix(n.Reason, "powered off: fence f1 confirmed it at 2026-01-01T00:00:02Z") {
		t.Fatalf("after the confirmed power-off, within the grace period: %v %q", n.Readiness, n.Reason)
	}
	late := start.Add(time.Minute)
	e.Tick(late)
	if n = e.Node("n1"); n.Readiness != coordv1.Readiness_READINESS_UNKNOWN || !strings.HasPrefix(n.Reason, "powered off: fence f1") || !strings.Contains(n.Reason, "no agent contact") {
		t.Fatalf("after the grace period: %v %q", n.Readiness, n.Reason)
	}
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b2", At: late})
	e.Step(PoweredOff{Node: "n1", Fence: "f1", At: off}) // the record's next version
	e.Tick(late.Add(time.Second))
	if n = e.Node("n1"); strings.Contains(n.Reason, "powered off") {
		t.Fatalf("after the node said hello again: %q", n.Reason)
	}
	e.Step(PoweredOff{Node: "nobody", Fence: "f2", At: late}) // an unknown node is ignored
	if e.Node("nobody") != nil {
		t.Fatal("PoweredOff created a node")
	}
}

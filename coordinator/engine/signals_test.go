package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A node's latest value of each signal is kept and shown; a node inventing signal names cannot make
// the coordinator keep more than maxSignals of them, and the ones it keeps still update.
func TestSignalsKeepLatestValueAndAreBounded(t *testing.T) {
	e := New(DefaultConfig())
	at := time.Unix(1_700_000_000, 0)
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b", At: at})
	var flood []*agentv1.Signal
	for i := range 3 * maxSignals {
		flood = append(flood, &agentv1.Signal{Name: fmt.Sprintf("made.up.%d", i), Available: int64(i)})
	}
	if !e.Observe("n1", at, &agentv1.SignalSample{Signals: flood}) {
		t.Fatal("Observe of a known node returned false")
	}
	e.Observe("n1", at.Add(time.Second), &agentv1.SignalSample{Signals: []*agentv1.Signal{{Name: "made.up.0", Available: 42}}})
	got := e.Node("n1").GetSignals()
	if len(got) != maxSignals {
		t.Errorf("kept %d signals, want the bound %d", len(got), maxSignals)
	}
	if got["made.up.0"] != 42 || got["made.up.1"] != 1 {
		t.Errorf("signals %v: want made.up.0=42 (updated) and made.up.1=1", got)
	}
	if _, ok := got[fmt.Sprintf("made.up.%d", maxSignals)]; ok {
		t.Errorf("a signal beyond the bound was kept")
	}
}

// The agent sends pressure-stall signals as the share NOT stalled (lower is worse, like every
// eviction signal); the node view also says what they measure: the share of time stalled. A value
// outside its capacity is not turned into a percentage.
func TestPressureStallReadsAsStalled(t *testing.T) {
	e := New(DefaultConfig())
	at := time.Unix(1_700_000_000, 0)
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b", At: at})
	e.Observe("n1", at, &agentv1.SignalSample{Signals: []*agentv1.Signal{
		{Name: "psi.memory.some", Available: 9750, Capacity: 10000},
		{Name: "psi.cpu.some", Available: 10000, Capacity: 10000},
		{Name: "psi.io.full", Available: 20000, Capacity: 10000},
		{Name: "memory.available", Available: 1 << 30, Capacity: 4 << 30},
	}})
	v := e.Node("n1")
	if got := v.GetStalledPercent(); len(got) != 2 || got["psi.memory.some"] != 2.5 || got["psi.cpu.some"] != 0 {
		t.Errorf("stalled percent %v, want psi.memory.some 2.5 and psi.cpu.some 0 only", got)
	}
	if v.GetSignals()["psi.memory.some"] != 9750 {
		t.Errorf("the raw signal changed: %v", v.GetSignals())
	}
}

// A node a fence confirmed off stays Ready until its grace period ends (readiness is
// kube-controller-manager's rule); its view says why it reads Ready although it is off.
func TestPoweredOffAndReadyIsExplained(t *testing.T) {
	e := New(DefaultConfig())
	at := time.Unix(1_700_000_000, 0)
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b", At: at})
	e.Tick(at.Add(time.Second))
	e.Step(PoweredOff{Node: "n1", Fence: "n1-1", At: at.Add(time.Second)})
	v := e.Node("n1")
	if v.Readiness != coordv1.Readiness_READINESS_READY || !strings.HasPrefix(v.Reason, "powered off: fence n1-1") || !strings.Contains(v.Reason, "still within the grace period") {
		t.Errorf("readiness %v, reason %q: want Ready explained by the confirmed power-off and the grace period", v.Readiness, v.Reason)
	}
}

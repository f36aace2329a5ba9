package engine

import (
	"fmt"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
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

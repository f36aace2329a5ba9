package engine

import (
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/nodefence/nodefence/services/cli"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The fence record's state transitions, and the test that the scenario scripts reach every one.
// A record's state is its status and, while it is unfinished, its step; a finished record's state
// also names the alarms written on it since (wrong machine, would release). The harness (keep)
// notes every transition a script makes, from "none" for a record created.

// fenceTransitions are every transition the rules make: creation (fencing.AutoRecord,
// OperatorRecord, ObservedRecord, Acknowledged), fencing.Decide's steps, an acknowledgement of an
// active record, the wrong-machine alarm (fencing.WrongMachine) and would release
// (fencing.WouldRelease, written on the release reconciler's verdict).
var fenceTransitions = []string{
	// created
	"none -> new isolation",
	"none -> new power_management",
	"none -> new recovery",
	"none -> finished done",
	"none -> finished observed",
	// fencing.Decide: a step starts, succeeds or fails
	"new isolation -> running isolation",
	"new power_management -> running power_management",
	"new recovery -> running recovery",
	"running isolation -> done isolation",
	"running isolation -> error isolation",
	"running power_management -> done power_management",
	"running power_management -> error power_management",
	"running recovery -> done recovery",
	// a witness came back before the next driver call of an automatic fence
	"running power_management -> finished error",
	// after a step
	"done isolation -> new recovery",
	"done isolation -> new power_management",
	"done isolation -> finished done",
	"done power_management -> finished done",
	"done power_management -> new recovery",
	"done power_management -> error power_management",
	"done recovery -> finished done",
	// retries and escalation
	"error isolation -> new isolation",
	"error power_management -> new power_management",
	"error power_management -> finished error",
	// an operator's acknowledgement of the active record
	"running power_management -> finished done",
	"new power_management -> finished done",
	// the proof's alarm, and observe mode's would release (the release reconciler's pass)
	"finished done -> finished done wrong-machine",
	"finished observed -> finished observed would-release",
}

// fenceState names a record's state (above); "none" for nil.
func fenceState(f *coordv1.NodeFence) string {
	if f == nil {
		return "none"
	}
	status := cli.EnumWord(f.GetStatus().String())
	if f.GetFinishedAt() == nil {
		return status + " " + cli.EnumWord(f.GetStep().String())
	}
	s := "finished " + status
	if f.GetWrongMachineAt() != nil {
		s += " wrong-machine"
	}
	if f.GetWouldReleaseAt() != nil {
		s += " would-release"
	}
	return s
}

// reached collects the transitions the scripts made, across scripts.
var reached = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// transition notes the move from one version of a node's record to the next (a new record's
// "from" is none, whatever the node's older record was).
func (f *fenceFlow) transition(prev, next *coordv1.NodeFence) {
	if prev != nil && prev.GetId() != next.GetId() {
		prev = nil
	}
	from, to := fenceState(prev), fenceState(next)
	if from == to {
		return
	}
	reached.Lock()
	reached.m[from+" -> "+to] = true
	reached.Unlock()
}

// TestFenceRecordTransitions runs every scenario script and fails on a transition of
// fenceTransitions that none reaches, and on one a script reaches that the list does not name.
func TestFenceRecordTransitions(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	reached.Lock()
	reached.m = map[string]bool{}
	reached.Unlock()
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
	reached.Lock()
	defer reached.Unlock()
	listed := map[string]bool{}
	for _, tr := range fenceTransitions {
		listed[tr] = true
		if !reached.m[tr] {
			t.Errorf("no scenario script reaches the fence record transition %q", tr)
		}
	}
	var extra []string
	for tr := range reached.m {
		if !listed[tr] {
			extra = append(extra, tr)
		}
	}
	sort.Strings(extra)
	for _, tr := range extra {
		t.Errorf("a script reaches %q, which fenceTransitions does not list", tr)
	}
}

package term

import (
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestAdmit: the fencing policy holds back a request whose node is not worth fencing (audited with
// why, in the words of the mode), adds its reason to the evidence of one that is, and is not asked
// about an enforced power cycle; without a verdict (standalone) every request is admitted. An
// admitted request's record is the request's, after the node's delay unless observed.
func TestAdmit(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	plan := func(step string) ([]fenceconfig.Resolved, error) {
		if step == fenceconfig.StepPowerManagement {
			return []fenceconfig.Resolved{{Name: "bmc", Driver: "d"}}, nil
		}
		return nil, nil
	}
	off := engine.FenceRequest{Node: "n1", Evidence: []string{"not ready"}}
	reboot := engine.FenceRequest{Node: "n1", Evidence: []string{"broken"}, Action: coordv1.FenceAction_FENCE_ACTION_REBOOT}
	observed := engine.FenceRequest{Node: "n1", Evidence: []string{"not ready"}, Observe: true}
	observedReboot := reboot
	observedReboot.Observe = true
	notNeeded := Policy{Asked: true, Why: "no pod on the node needs fencing"}
	needed := Policy{Asked: true, Needed: true, Why: "stateful pods on the node: db/0"}
	for _, tc := range []struct {
		name     string
		req      engine.FenceRequest
		p        Policy
		held     string
		evidence string // the record's last evidence of the request
		observed bool
		delayed  bool
	}{
		{"standalone: admitted", off, Policy{}, "", "not ready", false, true},
		{"not worth fencing: held", off, notNeeded, "automatic fencing not needed: no pod on the node needs fencing", "", false, false},
		{"stateful pods join the evidence", off, needed, "", "stateful pods on the node: db/0", false, true},
		{"an enforced power cycle skips the policy", reboot, notNeeded, "", "broken", false, true},
		{"observe mode: would not fence", observed, notNeeded, "observe mode: would not fence: no pod on the node needs fencing", "", true, false},
		{"observe mode: a power cycle asks the policy too", observedReboot, notNeeded, "observe mode: would not fence: no pod on the node needs fencing", "", true, false},
		{"observe mode: admitted, no delay", observed, needed, "", "stateful pods on the node: db/0", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ad := Admit(tc.req, tc.p, plan, 5*time.Second, 4, now)
			if ad.Held != tc.held {
				t.Errorf("held %q, want %q", ad.Held, tc.held)
			}
			if tc.held != "" {
				if ad.Record != nil {
					t.Errorf("a held request has a record: %v", ad.Record)
				}
				return
			}
			r := ad.Record
			if r == nil {
				t.Fatal("no record")
			}
			if !containsEvidence(r.Evidence, tc.evidence) || r.Epoch != 4 || fencing.Observed(r) != tc.observed {
				t.Errorf("record %v: want evidence %q, epoch 4, observed %v", r, tc.evidence, tc.observed)
			}
			if delayed := r.NextAttemptAt != nil && r.NextAttemptAt.AsTime().Equal(now.Add(5*time.Second)); delayed != tc.delayed {
				t.Errorf("delayed %v, want %v (next attempt %v)", delayed, tc.delayed, r.NextAttemptAt)
			}
		})
	}
}

// TestAdmitLeavesTheRequest: the policy's reason is added to the record, not to the request's
// evidence (the engine's Ready it came from).
func TestAdmitLeavesTheRequest(t *testing.T) {
	ev := make([]string, 1, 4)
	ev[0] = "not ready"
	req := engine.FenceRequest{Node: "n1", Evidence: ev}
	Admit(req, Policy{Asked: true, Needed: true, Why: "stateful pods"}, func(string) ([]fenceconfig.Resolved, error) { return nil, nil }, 0, 1, time.Unix(0, 0))
	if got := ev[:2][1]; got != "" {
		t.Errorf("the request's evidence array was written: %q", got)
	}
}

func containsEvidence(ev []string, want string) bool {
	for _, e := range ev {
		if e == want {
			return true
		}
	}
	return false
}

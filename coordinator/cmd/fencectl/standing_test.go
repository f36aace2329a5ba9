package main

import (
	"strings"
	"testing"
)

// powerOffs counts the power-off commands a simulated BMC received.
func powerOffs(t *testing.T, r *rig) int {
	t.Helper()
	calls, err := r.good.Calls()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, "set power 0") {
			n++
		}
	}
	return n
}

// A fence of a node that stands confirmed off says so and switches nothing (the coordinator
// answers with the standing record, already_off); --again fences anyway; an acknowledged node
// stands off too. list shows who asked for each record and why.
func TestFenceOfANodeAlreadyOff(t *testing.T) {
	r := startRig(t)
	if res := r.run(t, r.operator, "fence", "good", "--reason", "disk controller hung"); res.code != 0 {
		t.Fatalf("fence: %+v", res)
	}
	offs := powerOffs(t, r)
	res := r.run(t, r.operator, "fence", "good")
	if res.code != 0 || !strings.Contains(res.out, "node good is already off: fence good-") || !strings.Contains(res.out, "by read-back") ||
		!strings.Contains(res.out, "Not fenced again") {
		t.Fatalf("second fence: %+v", res)
	}
	if n := powerOffs(t, r); n != offs {
		t.Fatalf("a fence of a node already off switched it again: %d power-offs, want %d", n, offs)
	}
	if res := r.run(t, r.operator, "fence", "good", "-o", "json"); res.code != 0 || !strings.Contains(res.out, `"alreadyOff": true`) {
		t.Fatalf("second fence -o json: %+v", res)
	}
	if res := r.run(t, r.viewer, "audit", "--node", "good"); !strings.Contains(res.out, "operator/alice asked to fence good: node good stands confirmed off") {
		t.Errorf("audit lacks the refused fence: %s", res.out)
	}
	res = r.run(t, r.operator, "fence", "good", "--again", "--reason", "powered on by hand")
	if res.code != 0 || !strings.Contains(res.out, "power_management done") {
		t.Fatalf("fence --again: %+v", res)
	}
	if n := powerOffs(t, r); n <= offs {
		t.Fatalf("fence --again did not power the node off: %d power-offs", n)
	}

	if res := r.run(t, r.operator, "ack", "stuck", "--force", "--reason", "pulled its plug"); res.code != 0 {
		t.Fatalf("ack stuck: %+v", res)
	}
	if res := r.run(t, r.operator, "fence", "stuck"); res.code != 0 || !strings.Contains(res.out, "by alice's acknowledgement") {
		t.Fatalf("fence of an acknowledged node: %+v", res)
	}

	res = r.run(t, r.viewer, "list")
	for _, want := range []string{"REQUESTED BY", "REASON", "operator/alice", "disk controller hung", "powered on by hand", "acknowledged by alice", "acknowledged: FORCED"} {
		if res.code != 0 || !strings.Contains(res.out, want) {
			t.Errorf("list lacks %q:\n%s", want, res.out)
		}
	}
}

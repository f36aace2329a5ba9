package chaos

import (
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestViolationsWhileTheRunGoes(t *testing.T) {
	confirmed := func(id, node string, proof coordv1.FenceProof) *coordv1.NodeFence {
		return &coordv1.NodeFence{Id: id, Node: node, Status: coordv1.FenceStatus_FENCE_STATUS_DONE, ConfirmedOffAt: timestamppb.Now(), Proof: proof}
	}
	off := []string{"get power", "set power 0", "get power"}
	for _, tc := range []struct {
		name string
		o    observation
		want []string // the keys' kinds, sorted
	}{
		{"a dead node fenced once", observation{
			records: []*coordv1.NodeFence{confirmed("f1", "n1", coordv1.FenceProof_FENCE_PROOF_READ_BACK)},
			calls:   map[string][]string{"n1": off, "n2": nil}, dead: map[string]bool{"n1": true}}, nil},
		{"a retransmitted power-off is one", observation{
			calls: map[string][]string{"n1": {"set power 0", "set power 0"}}, dead: map[string]bool{"n1": true}}, nil},
		{"powered off twice", observation{
			calls: map[string][]string{"n1": {"set power 0", "set power 1", "set power 0"}}, dead: map[string]bool{"n1": true}}, []string{"twice"}},
		{"a live node powered off and given a record", observation{
			records: []*coordv1.NodeFence{{Id: "f2", Node: "n2"}},
			calls:   map[string][]string{"n2": off}, dead: map[string]bool{"n1": true}}, []string{"live-off", "live-record"}},
		{"read back off without a power-off", observation{
			records: []*coordv1.NodeFence{confirmed("f1", "n1", coordv1.FenceProof_FENCE_PROOF_READ_BACK)},
			calls:   map[string][]string{"n1": {"get power"}}, dead: map[string]bool{"n1": true}}, []string{"unproven"}},
		{"an operator's acknowledgement needs no power-off", observation{
			records: []*coordv1.NodeFence{confirmed("f1", "n1", coordv1.FenceProof_FENCE_PROOF_OPERATOR)},
			calls:   map[string][]string{"n1": nil}, dead: map[string]bool{"n1": true}}, nil},
		{"a stale epoch at the driver", observation{
			ops:  []driverOp{{OperationID: "a", Epoch: 5, Device: "d", Result: "confirmed"}, {OperationID: "b", Epoch: 4, Device: "d", Result: "confirmed"}},
			dead: map[string]bool{}}, []string{"stale"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kinds []string
			for k, msg := range tc.o.violations() {
				kind, _, _ := strings.Cut(k, " ")
				kinds = append(kinds, kind)
				t.Log(msg)
			}
			sort.Strings(kinds)
			if strings.Join(kinds, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("violations %v, want %v", kinds, tc.want)
			}
		})
	}
}

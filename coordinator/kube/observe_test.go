package kube

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestDecideReleaseObserveMode: a record made in observe mode never releases, taints or deletes
// anything; with the node's witnesses silent it yields "would release" once, until the record says
// it would have.
func TestDecideReleaseObserveMode(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	plan := func(string) ([]fenceconfig.Resolved, error) { return nil, nil }
	observed := fencing.ObservedRecord(fencing.AutoRequest{Node: "n"}, plan, 1, now.Add(-time.Minute))
	said := fencing.WouldRelease(observed, now.Add(-30*time.Second))
	if said == nil || fencing.WouldRelease(said, now) != nil {
		t.Fatal("WouldRelease: want the first time only")
	}
	// Even a record that claims a confirmed power-off is never applied once it says observed.
	claimed := fencing.ObservedRecord(fencing.AutoRequest{Node: "n"}, plan, 1, now.Add(-time.Minute))
	claimed.ConfirmedOffAt = timestamppb.New(now.Add(-time.Minute))
	dark := Proven{Fence: observed.GetId(), Verdict: fencing.ProofDark}
	for _, tc := range []struct {
		name string
		s    ReleaseState
		want ReleaseAction
	}{
		{"witnesses silent: would release", ReleaseState{Fence: observed}, ReleaseWould},
		{"proven dark too: still only would release", ReleaseState{Fence: observed, Proof: dark}, ReleaseWould},
		{"already said: nothing", ReleaseState{Fence: said}, ReleaseNothing},
		{"a witness reports: nothing", ReleaseState{Fence: observed, WitnessesBack: true}, ReleaseNothing},
		{"an earlier enforced taint on a healthy node comes off", ReleaseState{Fence: observed, Tainted: true, WitnessesBack: true,
			BackSince: now.Add(-time.Hour), NodeReady: true, ReadySince: now.Add(-time.Hour)}, ReleaseRemove},
		{"a forged confirmation on an observed record: nothing", ReleaseState{Fence: claimedDone(claimed), Proof: Proven{Fence: claimed.GetId(), Verdict: fencing.ProofDark}}, ReleaseNothing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, why := DecideRelease(tc.s, now, time.Minute)
			if got != tc.want {
				t.Errorf("DecideRelease = %v (%s), want %v", got, why, tc.want)
			}
			if got == ReleaseApply {
				t.Errorf("an observed record released pods: %s", why)
			}
		})
	}
}

// claimedDone marks the claimed record as already having said would release, so that only the
// confirmed-off claim could make it release.
func claimedDone(f *coordv1.NodeFence) *coordv1.NodeFence {
	f.WouldReleaseAt = f.GetCreatedAt()
	return f
}

// TestNodeInputModes: the Node's fence-mode annotation and exclude-from-fencing label reach the
// engine; an annotation value that is neither mode observes the node and says why.
func TestNodeInputModes(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	node := func(labels, annotations map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: annotations}}
	}
	for _, tc := range []struct {
		name             string
		n                *corev1.Node
		observe, exclude bool
		note             string
	}{
		{"none", node(nil, nil), false, false, ""},
		{"observe", node(nil, map[string]string{AnnotationFenceMode: "observe"}), true, false, ""},
		{"enforce follows the flag", node(nil, map[string]string{AnnotationFenceMode: "enforce"}), false, false, ""},
		{"a typo observes", node(nil, map[string]string{AnnotationFenceMode: "obsrve"}), true, false, `annotation nodefence.io/fence-mode: fence mode "obsrve": want observe or enforce`},
		{"the label excludes, any value", node(map[string]string{LabelExcludeFencing: ""}, nil), false, true, ""},
		{"the label as an annotation does nothing", node(nil, map[string]string{LabelExcludeFencing: "true"}), false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NodeInput(tc.n, true, nil, at)
			if c.Observe != tc.observe || c.ExcludeFencing != tc.exclude || !strings.HasPrefix(c.ModeNote, tc.note) || (tc.note == "") != (c.ModeNote == "") {
				t.Errorf("NodeInput = observe %v exclude %v note %q; want %v %v %q", c.Observe, c.ExcludeFencing, c.ModeNote, tc.observe, tc.exclude, tc.note)
			}
		})
	}
}

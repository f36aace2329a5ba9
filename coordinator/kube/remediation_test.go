package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/release"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestDecideRemediation(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	created := now.Add(-time.Minute)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	rec := func(id string, at time.Duration, mut func(*coordv1.NodeFence)) *coordv1.NodeFence {
		f := &coordv1.NodeFence{Id: id, Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, CreatedAt: ts(at), Status: coordv1.FenceStatus_FENCE_STATUS_RUNNING}
		if mut != nil {
			mut(f)
		}
		return f
	}
	confirmed := func(f *coordv1.NodeFence) {
		f.ConfirmedOffAt, f.Status = ts(-10*time.Second), coordv1.FenceStatus_FENCE_STATUS_DONE
	}
	silent := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_UNKNOWN, Reason: "no agent contact"}
	alive := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_READY}
	agentDown := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_READY, AgentDown: true}
	base := RemediationState{Node: "n1", Created: created, Fenceable: true}
	with := func(mut func(*RemediationState)) RemediationState { s := base; mut(&s); return s }
	F, T, U := metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionUnknown
	for _, tc := range []struct {
		name          string
		s             RemediationState
		proc, ok      metav1.ConditionStatus
		reason, fence string
		request       bool
	}{
		{"the checker timed it out", with(func(s *RemediationState) { s.TimedOut, s.View = true, silent }), F, F, ReasonTimedOut, "", false},
		{"a Machine without a node", with(func(s *RemediationState) { s.Node = "" }), U, U, ReasonMachineNotMapped, "", false},
		{"not in the fence configuration", with(func(s *RemediationState) { s.Fenceable = false }), F, F, ReasonNodeUnknown, "", false},
		{"witnesses report: escalate", with(func(s *RemediationState) { s.View = alive }), F, F, ReasonWitnessesReport, "", false},
		{"one witness reports: escalate", with(func(s *RemediationState) { s.View = agentDown }), F, F, ReasonWitnessesReport, "", false},
		{"witnesses report, the spec allows it: fence", with(func(s *RemediationState) { s.View, s.AllowLiveWitnesses = alive, true }), T, U, ReasonFencing, "", true},
		{"silent: nodefence's own decision", with(func(s *RemediationState) { s.View = silent }), T, U, ReasonWaiting, "", false},
		{"a record running", with(func(s *RemediationState) { s.View, s.Fence, s.Running = silent, rec("r1", -time.Hour, nil), true }), T, U, ReasonFencing, "r1", false},
		{"confirmed, proof pending", with(func(s *RemediationState) { s.View, s.Fence = silent, rec("r1", -30*time.Second, confirmed) }), T, U, ReasonFencing, "r1", false},
		{"confirmed and proven dark", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -30*time.Second, confirmed), release.Proven{Fence: "r1", Verdict: fencing.ProofDark}
		}), F, T, ReasonFenced, "r1", false},
		{"the proof of another record does not count", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -30*time.Second, confirmed), release.Proven{Fence: "r0", Verdict: fencing.ProofDark}
		}), T, U, ReasonFencing, "r1", false},
		{"fenced long before the checker noticed", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -time.Hour, confirmed), release.Proven{Fence: "r1", Verdict: fencing.ProofDark}
		}), F, T, ReasonFenced, "r1", false},
		{"acknowledged by an operator", with(func(s *RemediationState) {
			s.View, s.Fence = silent, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) { confirmed(f); f.AcknowledgedBy = "operator/alice" })
		}), F, T, ReasonFenced, "r1", false},
		{"the wrong machine", with(func(s *RemediationState) {
			s.View, s.Fence = alive, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) { confirmed(f); f.WrongMachineAt = ts(-5 * time.Second) })
		}), F, F, ReasonWrongMachine, "r1", false},
		{"the fence failed", with(func(s *RemediationState) {
			s.View, s.Fence = silent, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) {
				f.Status, f.Error = coordv1.FenceStatus_FENCE_STATUS_ERROR, "bmc unreachable"
			})
		}), F, F, ReasonFenceFailed, "r1", false},
		{"an old unfence does not count", with(func(s *RemediationState) {
			s.View, s.Fence = alive, rec("r0", -time.Hour, func(f *coordv1.NodeFence) {
				f.Action, f.Status = coordv1.FenceAction_FENCE_ACTION_ON, coordv1.FenceStatus_FENCE_STATUS_DONE
			})
		}), F, F, ReasonWitnessesReport, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := DecideRemediation(tc.s)
			if v.Processing != tc.proc || v.Succeeded != tc.ok || v.Reason != tc.reason || v.Fence != tc.fence || v.Request != tc.request {
				t.Errorf("DecideRemediation = Processing %s, Succeeded %s, %s, fence %q, request %v (%s); want %s, %s, %s, fence %q, request %v",
					v.Processing, v.Succeeded, v.Reason, v.Fence, v.Request, v.Message, tc.proc, tc.ok, tc.reason, tc.fence, tc.request)
			}
		})
	}
}

// noFacts is a coordinator without a fence configuration: every node is unknown to it.
type noFacts struct{}

func (noFacts) Fence(context.Context, string) (*coordv1.NodeFence, bool, error) {
	return nil, false, nil
}
func (noFacts) Node(context.Context, string) (*coordv1.Node, error)   { return nil, nil }
func (noFacts) Proof(context.Context, string) (release.Proven, error) { return release.Proven{}, nil }
func (noFacts) Fenceable(string) bool                                 { return false }
func (noFacts) RequestFence(context.Context, string, string, string) (string, error) {
	return "", errors.New("no fence expected")
}

// A pass as the coordinator's ServiceAccount (deploy/'s RBAC only) on a real kube-apiserver: it
// writes the remediation's status, counts a remediation older than 48 h as overdue, and a second
// pass with nothing changed writes nothing.
func TestRemediationPass(t *testing.T) {
	ctx := testContext(t)
	ns := "remediation-pass"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	adminDyn := dynamic.NewForConfigOrDie(cluster.Config())
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nodefence.io/v1alpha1", "kind": RemediationKind,
		"metadata": map[string]any{"name": "n1", "namespace": ns}, "spec": map[string]any{}}}
	if _, err := adminDyn.Resource(RemediationResource).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	c := NewRemediationController(newWriter(t).Dynamic(), noFacts{}, nil, func() time.Time { return clock })
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Overdue() != 0 {
		t.Errorf("overdue %d just after creation", c.Overdue())
	}
	got, err := adminDyn.Resource(RemediationResource).Namespace(ns).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := metaCondition(got, ConditionSucceeded)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonNodeUnknown {
		t.Fatalf("Succeeded condition %+v, want False %s", cond, ReasonNodeUnknown)
	}
	rv := got.GetResourceVersion()
	clock = clock.Add(RemediationOverdue + time.Hour)
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Overdue() != 1 {
		t.Errorf("overdue %d two days later, want 1", c.Overdue())
	}
	if got, err = adminDyn.Resource(RemediationResource).Namespace(ns).Get(ctx, "n1", metav1.GetOptions{}); err != nil || got.GetResourceVersion() != rv {
		t.Errorf("a pass with nothing changed wrote the status (resourceVersion %s -> %s, %v)", rv, got.GetResourceVersion(), err)
	}
}

func metaCondition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	var st remediationStatus
	m, ok, _ := unstructured.NestedMap(u.Object, "status")
	if !ok || runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st) != nil {
		return nil
	}
	return meta.FindStatusCondition(st.Conditions, typ)
}

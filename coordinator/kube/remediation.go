package kube

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/release"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The remediation API (deploy/crd-nodefenceremediations.yaml), following the medik8s remediation
// contract that NodeHealthCheck drives and Cluster API's external remediation shares: a health
// checker creates a NodeFenceRemediation named after the node (Cluster API: after its Machine, owned
// by it), nodefence reports progress with the Processing and Succeeded conditions, stops when the
// checker marks it timed out, and never deletes it (the checker does, once the node is healthy).
const (
	RemediationKind = "NodeFenceRemediation"
	// AnnotationTimedOut is set by NodeHealthCheck on a remediation it gave up on (it escalates to
	// its next remediator): nodefence stops working on it.
	AnnotationTimedOut = "remediation.medik8s.io/nhc-timed-out"
	// ConditionProcessing is True while nodefence works on the remediation.
	ConditionProcessing = "Processing"
	// ConditionSucceeded is True once the node is fenced (confirmed off and proven dark, or
	// acknowledged), False when nodefence will not or could not fence it.
	ConditionSucceeded = "Succeeded"
)

// RemediationResource is the NodeFenceRemediation resource.
var RemediationResource = schema.GroupVersionResource{Group: FenceGroup, Version: FenceVersion, Resource: "nodefenceremediations"}

// Remediation reasons, in the conditions' reason field.
const (
	ReasonTimedOut         = "TimedOut"
	ReasonNodeUnknown      = "NodeNotFenceable"
	ReasonWitnessesReport  = "WitnessesReport"
	ReasonWaiting          = "WaitingForNodefence"
	ReasonFencing          = "Fencing"
	ReasonFenced           = "Fenced"
	ReasonFenceFailed      = "FenceFailed"
	ReasonWrongMachine     = "WrongMachine"
	ReasonMachineNotMapped = "MachineWithoutNode"
)

// RemediationState is what one pass observes about a remediation.
type RemediationState struct {
	// Node is the node it is about ("" when its Machine names no node yet).
	Node string
	// Created is when the remediation was created; Now the pass's time.
	Created time.Time
	// TimedOut is set when the health checker gave up on it (AnnotationTimedOut).
	TimedOut bool
	// AllowLiveWitnesses is the spec's override: fence even while a witness reports.
	AllowLiveWitnesses bool
	// Fenceable is set when the node is in the fence configuration.
	Fenceable bool
	// View is the engine's view of the node (nil when it has none).
	View *coordv1.Node
	// Fence is the node's newest fence record (nil: none), Running while one of its records runs.
	Fence   *coordv1.NodeFence
	Running bool
	// Proof is the leader's proof of Fence.
	Proof release.Proven
}

// RemediationVerdict is what a pass reports on the remediation, and whether to fence now.
type RemediationVerdict struct {
	Processing, Succeeded metav1.ConditionStatus
	Reason, Message       string
	// Fence is the record that remediates the node ("" when none does).
	Fence string
	// Request asks for an operator-style fence of the node now (the spec's override).
	Request bool
}

// DecideRemediation is the remediation rule, pure. nodefence fences by its own rules: a node whose
// witnesses are silent is fenced by the engine's own decision (storm guard, zone pacing, proof
// before release); the remediation only follows it. A node nodefence still hears is not fenced
// unless the spec allows it (then as an operator's fence, audited with the requester), and the
// remediation says Succeeded=False so that NodeHealthCheck escalates. The record that counts is the
// node's newest: one created since the remediation, one still running, or a power-off that still
// stands (nodefence may have fenced the node long before the health checker noticed).
func DecideRemediation(s RemediationState) RemediationVerdict {
	v := func(p, ok metav1.ConditionStatus, reason, format string, args ...any) RemediationVerdict {
		return RemediationVerdict{Processing: p, Succeeded: ok, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	F, T, U := metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionUnknown
	if s.TimedOut {
		r := v(F, F, ReasonTimedOut, "the health checker timed this remediation out: nodefence stops working on it (a power-off already at a device runs to its read-back)")
		r.Fence = s.Fence.GetId()
		return r
	}
	if s.Node == "" {
		return v(U, U, ReasonMachineNotMapped, "the Machine names no node yet (status.nodeRef)")
	}
	if !s.Fenceable {
		return v(F, F, ReasonNodeUnknown, "node %s is not in nodefence's fence configuration", s.Node)
	}
	if f := s.Fence; f != nil && (s.Running || !f.GetCreatedAt().AsTime().Before(s.Created) || fencing.HoldsAutoFence(f)) {
		r := followFence(s)
		r.Fence = f.GetId()
		return r
	}
	if s.View != nil && !fencing.Alive(s.View) {
		state := s.View.GetReadiness().String()
		if s.View.GetSilentSince() != nil {
			state = "silent (agent and kubelet past their windows)"
		}
		return v(T, U, ReasonWaiting, "node %s is %s to nodefence (%s): its own decision fences it (%s)", s.Node,
			state, s.View.GetReason(), orNone(s.View.GetFenceBlocked(), "fence timeout and zone pacing"))
	}
	if s.AllowLiveWitnesses {
		r := v(T, U, ReasonFencing, "the remediation allows fencing a node whose witnesses report: fencing %s", s.Node)
		r.Request = true
		return r
	}
	return v(F, F, ReasonWitnessesReport, "nodefence hears node %s's witnesses (%s): it fences only a node whose agent and kubelet are silent, unless spec.allowLiveWitnesses", s.Node, witnessWords(s.View))
}

// followFence reports the progress of the record that remediates the node.
func followFence(s RemediationState) RemediationVerdict {
	f := s.Fence
	F, T, U := metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionUnknown
	proof := s.Proof
	if proof.Fence != f.GetId() {
		proof = release.Proven{}
	}
	switch {
	case f.GetWrongMachineAt() != nil || proof.Verdict == fencing.ProofWrongMachine:
		return RemediationVerdict{Processing: F, Succeeded: F, Reason: ReasonWrongMachine,
			Message: fmt.Sprintf("fence %s switched off another machine (the node kept reporting): an operator must act", f.GetId())}
	case f.GetConfirmedOffAt() != nil && (!fencing.NeedsProof(f) || proof.Verdict == fencing.ProofDark):
		return RemediationVerdict{Processing: F, Succeeded: T, Reason: ReasonFenced,
			Message: fmt.Sprintf("fence %s confirmed node %s off (%s); its pods are released", f.GetId(), s.Node, confirmedBy(f))}
	case f.GetConfirmedOffAt() != nil:
		return RemediationVerdict{Processing: T, Succeeded: U, Reason: ReasonFencing,
			Message: fmt.Sprintf("fence %s confirmed node %s off; its witnesses are observed before anything is released", f.GetId(), s.Node)}
	case f.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_ERROR && !s.Running:
		return RemediationVerdict{Processing: F, Succeeded: F, Reason: ReasonFenceFailed,
			Message: fmt.Sprintf("fence %s failed: %s", f.GetId(), f.GetError())}
	}
	return RemediationVerdict{Processing: T, Succeeded: U, Reason: ReasonFencing,
		Message: fmt.Sprintf("fence %s is %s (step %s)", f.GetId(), f.GetStatus().String(), f.GetStep().String())}
}

func confirmedBy(f *coordv1.NodeFence) string {
	if f.GetAcknowledgedBy() != "" {
		return "acknowledged by " + f.GetAcknowledgedBy()
	}
	return "read back by its driver, the node proven dark"
}

func witnessWords(v *coordv1.Node) string {
	switch {
	case v == nil:
		return "unknown to the engine"
	case v.GetAgentDown():
		return "kubelet reporting, agent silent"
	case v.GetKubeletDown():
		return "agent reporting, kubelet silent"
	}
	return "agent and kubelet reporting"
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

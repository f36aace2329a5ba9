package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodefence/nodefence/coordinator/fencing"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/services/cli"
)

// The NodeFence custom resource (deploy/crd-nodefences.yaml).
const (
	FenceGroup   = "nodefence.io"
	FenceVersion = "v1alpha1"
	FenceKind    = "NodeFence"
	// LabelNode carries the fenced node's name on NodeFence objects (when it is a valid label value),
	// for kubectl get nodefences -l nodefence.io/node=<node>.
	LabelNode = "nodefence.io/node"
)

// FenceResource is the NodeFence resource.
var FenceResource = schema.GroupVersionResource{Group: FenceGroup, Version: FenceVersion, Resource: "nodefences"}

// FenceSpec is the NodeFence spec: what was asked.
type FenceSpec struct {
	ID          string `json:"id"`
	Node        string `json:"node"`
	Action      string `json:"action"`
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
	Automatic   bool   `json:"automatic,omitempty"`
}

// FenceStatus is the NodeFence status: the record's progress.
type FenceStatus struct {
	Step           string `json:"step,omitempty"`
	Status         string `json:"status,omitempty"`
	Retries        int32  `json:"retries,omitempty"`
	Polls          int32  `json:"polls,omitempty"`
	Epoch          int64  `json:"epoch,omitempty"`
	Error          string `json:"error,omitempty"`
	AcknowledgedBy string `json:"acknowledgedBy,omitempty"`
	// Proof is what proves the node off: read-back, operator or watchdog-timeout.
	Proof          string       `json:"proof,omitempty"`
	Evidence       []string     `json:"evidence,omitempty"`
	CreatedAt      *metav1.Time `json:"createdAt,omitempty"`
	UpdatedAt      *metav1.Time `json:"updatedAt,omitempty"`
	FinishedAt     *metav1.Time `json:"finishedAt,omitempty"`
	ConfirmedOffAt *metav1.Time `json:"confirmedOffAt,omitempty"`
	NextAttemptAt  *metav1.Time `json:"nextAttemptAt,omitempty"`
	WouldReleaseAt *metav1.Time `json:"wouldReleaseAt,omitempty"`
	// LastContactAt and NotReadySince start an automatic fence's timeline (fencectl timeline).
	LastContactAt *metav1.Time     `json:"lastContactAt,omitempty"`
	NotReadySince *metav1.Time     `json:"notReadySince,omitempty"`
	Operations    []FenceOperation `json:"operations,omitempty"`
	// Conditions are Kubernetes-style: Fenced, Finished, Failed.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeFence condition types.
const (
	// FenceConditionFenced is True once the node's power-off or isolation is confirmed (a driver's
	// read-back, an operator's acknowledgement, or fence_kdump): only then are pods released.
	FenceConditionFenced = "Fenced"
	// FenceConditionFinished is True once the record has finished, done or in error.
	FenceConditionFinished = "Finished"
	// FenceConditionFailed is True while the record is in error.
	FenceConditionFailed = "Failed"
)

// FenceConditions derives a record's conditions; each transition time is the record's own time of
// the change (confirmation, finish, last update), so mirroring a record twice writes the same.
func FenceConditions(rec *coordv1.NodeFence) []metav1.Condition {
	at := func(t *timestamppb.Timestamp) metav1.Time {
		if t == nil {
			t = rec.GetUpdatedAt()
		}
		if t == nil {
			t = rec.GetCreatedAt()
		}
		if t == nil {
			return metav1.Time{}
		}
		return metav1.NewTime(t.AsTime().Truncate(time.Second))
	}
	cond := func(typ string, ok bool, t *timestamppb.Timestamp, yes, no, msgYes, msgNo string) metav1.Condition {
		c := metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: no, Message: msgNo, LastTransitionTime: at(rec.GetCreatedAt())}
		if ok {
			c.Status, c.Reason, c.Message, c.LastTransitionTime = metav1.ConditionTrue, yes, msgYes, at(t)
		}
		return c
	}
	confirmed := rec.GetConfirmedOffAt() != nil
	fencedYes := "ReadBack"
	switch {
	case rec.GetAcknowledgedBy() != "":
		fencedYes = "Acknowledged"
	case rec.GetAction() == coordv1.FenceAction_FENCE_ACTION_ON, rec.GetAction() == coordv1.FenceAction_FENCE_ACTION_REBOOT:
		fencedYes = "NotApplicable"
	}
	failed := rec.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_ERROR
	fencedNo, fencedNoMsg := "NotConfirmed", "power-off or isolation not confirmed yet"
	if rec.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_OBSERVED {
		fencedNo, fencedNoMsg = "Observed", "observe mode: recorded as would fence; nothing was switched"
	}
	errMsg := rec.GetError()
	if errMsg == "" {
		errMsg = "the step failed"
	}
	return []metav1.Condition{
		cond(FenceConditionFenced, confirmed, rec.GetConfirmedOffAt(), fencedYes, fencedNo,
			"power-off or isolation confirmed; pods may be released", fencedNoMsg),
		cond(FenceConditionFinished, rec.GetFinishedAt() != nil, rec.GetFinishedAt(), "Finished", "InProgress",
			"the record finished", "the record is in progress"),
		cond(FenceConditionFailed, failed, rec.GetUpdatedAt(), "StepFailed", "NoError", errMsg, "no error"),
	}
}

// FenceOperation is one fence-driver call of a NodeFence.
type FenceOperation struct {
	OperationID string       `json:"operationId"`
	Method      string       `json:"method,omitempty"`
	Driver      string       `json:"driver,omitempty"`
	Action      string       `json:"action,omitempty"`
	Step        string       `json:"step,omitempty"`
	Attempt     int32        `json:"attempt,omitempty"`
	Required    bool         `json:"required,omitempty"`
	Epoch       int64        `json:"epoch,omitempty"`
	Result      string       `json:"result,omitempty"`
	State       string       `json:"state,omitempty"`
	Error       string       `json:"error,omitempty"`
	StartedAt   *metav1.Time `json:"startedAt,omitempty"`
	FinishedAt  *metav1.Time `json:"finishedAt,omitempty"`
}

// FenceObjectName is the NodeFence name of a record: its id, lowercased (record ids are
// <node>-<UTC time> with an upper-case T, and object names must be lowercase).
func FenceObjectName(id string) (string, error) {
	name := strings.ToLower(id)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("fence record id %q is no object name: %s", id, strings.Join(errs, "; "))
	}
	return name, nil
}

// FenceObject converts a fence record into its NodeFence object (spec and status).
func FenceObject(rec *coordv1.NodeFence) (*unstructured.Unstructured, error) {
	name, err := FenceObjectName(rec.GetId())
	if err != nil {
		return nil, err
	}
	spec := FenceSpec{
		ID: rec.GetId(), Node: rec.GetNode(), Action: fenceAction(rec.GetAction()),
		Reason: rec.GetReason(), RequestedBy: rec.GetRequestedBy(), Automatic: rec.GetAutomatic(),
	}
	st := FenceStatus{
		Step: crdWord(rec.GetStep().String()), Status: crdWord(rec.GetStatus().String()),
		Retries: rec.GetRetries(), Polls: rec.GetPolls(), Epoch: rec.GetEpoch(), Error: rec.GetError(),
		AcknowledgedBy: rec.GetAcknowledgedBy(), Proof: fencing.ProofName(rec.GetProof()), Evidence: rec.GetEvidence(),
		CreatedAt: ts(rec.GetCreatedAt()), UpdatedAt: ts(rec.GetUpdatedAt()), FinishedAt: ts(rec.GetFinishedAt()),
		ConfirmedOffAt: ts(rec.GetConfirmedOffAt()), NextAttemptAt: ts(rec.GetNextAttemptAt()),
		WouldReleaseAt: ts(rec.GetWouldReleaseAt()), Conditions: FenceConditions(rec),
		LastContactAt: ts(rec.GetLastContactAt()), NotReadySince: ts(rec.GetNotReadySince()),
	}
	for _, op := range rec.GetOperations() {
		st.Operations = append(st.Operations, FenceOperation{
			OperationID: op.GetOperationId(), Method: op.GetMethod(), Driver: op.GetDriver(), Action: op.GetAction(),
			Step: crdWord(op.GetStep().String()), Attempt: op.GetAttempt(), Required: op.GetRequired(), Epoch: op.GetEpoch(),
			Result: crdWord(op.GetResult().String()), State: crdWord(op.GetState().String()), Error: op.GetError(),
			StartedAt: ts(op.GetStartedAt()), FinishedAt: ts(op.GetFinishedAt()),
		})
	}
	obj := map[string]any{
		"apiVersion": FenceGroup + "/" + FenceVersion,
		"kind":       FenceKind,
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
		"status":     st,
	}
	if len(validation.IsValidLabelValue(rec.GetNode())) == 0 {
		obj["metadata"] = map[string]any{"name": name, "labels": map[string]any{LabelNode: rec.GetNode()}}
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return u, nil
}

// MirrorFence creates or updates the NodeFence object of a fence record, spec and status
// (server-side apply, the status through its subresource). The coordinator's etcd stays the source
// of truth: the object is only a view, and a record older than the object (by updatedAt, then
// epoch) is not written over it, so a deposed leader's late mirror cannot roll it back.
func (w *Writer) MirrorFence(ctx context.Context, rec *coordv1.NodeFence) error {
	obj, err := FenceObject(rec)
	if err != nil {
		return err
	}
	res := w.dyn.Resource(FenceResource)
	cur, err := res.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get nodefence %s: %w", obj.GetName(), err)
	default:
		if newerMirror(cur, rec) {
			w.log.Debug("nodefence mirror is newer; not rolled back", "nodefence", obj.GetName())
			return nil
		}
	}
	status := obj.Object["status"]
	spec := obj.DeepCopy()
	delete(spec.Object, "status")
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	if _, err := res.Apply(ctx, obj.GetName(), spec, opts); err != nil {
		return fmt.Errorf("apply nodefence %s: %w", obj.GetName(), err)
	}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(),
		"metadata": map[string]any{"name": obj.GetName()},
		"status":   status,
	}}
	if _, err := res.ApplyStatus(ctx, obj.GetName(), st, opts); err != nil {
		return fmt.Errorf("apply nodefence %s status: %w", obj.GetName(), err)
	}
	return nil
}

// GetFence reads the NodeFence object of a record id back as spec and status.
func (w *Writer) GetFence(ctx context.Context, id string) (FenceSpec, FenceStatus, error) {
	var spec FenceSpec
	var st FenceStatus
	name, err := FenceObjectName(id)
	if err != nil {
		return spec, st, err
	}
	u, err := w.dyn.Resource(FenceResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return spec, st, err
	}
	data, err := json.Marshal(u.Object["spec"])
	if err == nil {
		err = json.Unmarshal(data, &spec)
	}
	if err == nil && u.Object["status"] != nil {
		if data, err = json.Marshal(u.Object["status"]); err == nil {
			err = json.Unmarshal(data, &st)
		}
	}
	return spec, st, err
}

// newerMirror tells whether the object cur already mirrors a later state than rec.
func newerMirror(cur *unstructured.Unstructured, rec *coordv1.NodeFence) bool {
	updated, _, _ := unstructured.NestedString(cur.Object, "status", "updatedAt")
	epoch, _, _ := unstructured.NestedInt64(cur.Object, "status", "epoch")
	if epoch > rec.GetEpoch() {
		return true
	}
	if updated == "" || rec.GetUpdatedAt() == nil {
		return false
	}
	t, err := time.Parse(time.RFC3339, updated)
	// The object keeps seconds only: a record in the same second is never older.
	return err == nil && epoch == rec.GetEpoch() && t.After(rec.GetUpdatedAt().AsTime().Truncate(time.Second))
}

func ts(t *timestamppb.Timestamp) *metav1.Time {
	if t == nil {
		return nil
	}
	mt := metav1.NewTime(t.AsTime())
	return &mt
}

func fenceAction(a coordv1.FenceAction) string {
	switch a {
	case coordv1.FenceAction_FENCE_ACTION_ON:
		return "on"
	case coordv1.FenceAction_FENCE_ACTION_REBOOT:
		return "reboot"
	}
	return "off"
}

// crdWord is an enum value as the NodeFence resource spells it: the lowercase word after its type
// prefix, "" when unspecified.
func crdWord(name string) string {
	if strings.HasSuffix(name, "_UNSPECIFIED") {
		return ""
	}
	return cli.EnumWord(name)
}

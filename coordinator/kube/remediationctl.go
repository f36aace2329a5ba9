package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// RemediationFacts is what the remediation controller reads from (and asks of) the coordinator.
type RemediationFacts interface {
	ReleaseFacts
	// Fenceable reports whether the node is in the fence configuration.
	Fenceable(node string) bool
	// RequestFence starts an operator-style power-off of the node on behalf of requester.
	RequestFence(ctx context.Context, node, requester, reason string) (string, error)
}

// RemediationController reports on every NodeFenceRemediation of the cluster, level-triggered: each
// pass lists them, decides each one's conditions (DecideRemediation) and writes the status when it
// changed. It keeps no state beyond the objects, so a new leader finishes whatever was left.
type RemediationController struct {
	dyn   dynamic.Interface
	facts RemediationFacts
	log   *slog.Logger
	now   func() time.Time
	// OnRequest, if set, is told of each fence a remediation requested (for the audit trail).
	OnRequest func(node, remediation, fence string)
	missing   bool // the CRD is not installed (logged once)
	overdue   atomic.Int64
}

// RemediationOverdue is how old a remediation may get before it counts as overdue: a node
// NodeHealthCheck still finds unhealthy after two days needs a person (NHC counts the same).
const RemediationOverdue = 48 * time.Hour

// Overdue is how many remediations the latest pass found older than RemediationOverdue.
func (c *RemediationController) Overdue() int64 {
	if c == nil {
		return 0
	}
	return c.overdue.Load()
}

// NewRemediationController returns a controller writing through dyn.
func NewRemediationController(dyn dynamic.Interface, facts RemediationFacts, log *slog.Logger, now func() time.Time) *RemediationController {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	return &RemediationController{dyn: dyn, facts: facts, log: log, now: now}
}

// Run makes a pass every interval until ctx ends.
func (c *RemediationController) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.Pass(pctx); err != nil && ctx.Err() == nil {
			c.log.Warn("remediation pass failed; retrying", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass reconciles every NodeFenceRemediation once.
func (c *RemediationController) Pass(ctx context.Context) error {
	list, err := c.dyn.Resource(RemediationResource).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		if !c.missing {
			c.missing = true
			c.log.Info("NodeFenceRemediation CRD not installed: remediation requests are not served (deploy/crd-nodefenceremediations.yaml)")
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("list nodefenceremediations: %w", err)
	}
	c.missing = false
	var errs []error
	overdue := int64(0)
	for i := range list.Items {
		if c.now().Sub(list.Items[i].GetCreationTimestamp().Time) > RemediationOverdue {
			overdue++
		}
		if err := c.reconcile(ctx, &list.Items[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", list.Items[i].GetNamespace(), list.Items[i].GetName(), err))
		}
	}
	c.overdue.Store(overdue)
	return errors.Join(errs...)
}

// remediationStatus is the status the controller writes.
type remediationStatus struct {
	Node       string             `json:"node,omitempty"`
	Fence      string             `json:"fence,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

func (c *RemediationController) reconcile(ctx context.Context, u *unstructured.Unstructured) error {
	node, err := c.nodeOf(ctx, u)
	if err != nil {
		return err
	}
	allow, _, _ := unstructured.NestedBool(u.Object, "spec", "allowLiveWitnesses")
	s := RemediationState{Node: node, Created: u.GetCreationTimestamp().Time, TimedOut: u.GetAnnotations()[AnnotationTimedOut] != "",
		AllowLiveWitnesses: allow}
	if node != "" {
		s.Fenceable = c.facts.Fenceable(node)
		if s.View, err = c.facts.Node(ctx, node); err != nil {
			return err
		}
		if s.Fence, s.Running, err = c.facts.Fence(ctx, node); err != nil {
			return err
		}
		if s.Proof, err = c.facts.Proof(ctx, node); err != nil {
			return err
		}
	}
	v := DecideRemediation(s)
	if v.Request {
		who := "remediation/" + u.GetNamespace() + "/" + u.GetName()
		id, err := c.facts.RequestFence(ctx, node, who, "NodeFenceRemediation "+u.GetNamespace()+"/"+u.GetName()+" allows fencing a node whose witnesses report")
		if err != nil {
			return fmt.Errorf("fence %s: %w", node, err)
		}
		v.Fence = id
		if c.OnRequest != nil {
			c.OnRequest(node, u.GetNamespace()+"/"+u.GetName(), id)
		}
	}
	return c.writeStatus(ctx, u, node, v)
}

// writeStatus sets the conditions (a condition's transition time moves only when its status does)
// and writes the status subresource when anything changed.
func (c *RemediationController) writeStatus(ctx context.Context, u *unstructured.Unstructured, node string, v RemediationVerdict) error {
	var old remediationStatus
	if m, ok, _ := unstructured.NestedMap(u.Object, "status"); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(m, &old)
	}
	st := remediationStatus{Node: node, Fence: v.Fence, Conditions: append([]metav1.Condition(nil), old.Conditions...)}
	now := metav1.NewTime(c.now())
	for _, cond := range []metav1.Condition{
		{Type: ConditionProcessing, Status: v.Processing, Reason: v.Reason, Message: v.Message},
		{Type: ConditionSucceeded, Status: v.Succeeded, Reason: v.Reason, Message: v.Message},
	} {
		cond.ObservedGeneration, cond.LastTransitionTime = u.GetGeneration(), now
		meta.SetStatusCondition(&st.Conditions, cond)
	}
	if reflect.DeepEqual(old, st) {
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return err
	}
	u = u.DeepCopy()
	if err := unstructured.SetNestedMap(u.Object, m, "status"); err != nil {
		return err
	}
	_, err = c.dyn.Resource(RemediationResource).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: "nodefence-coordinator"})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // changed or deleted meanwhile: the next pass sees it
	}
	if err == nil {
		c.log.Info("remediation", "remediation", u.GetNamespace()+"/"+u.GetName(), "node", node, "processing", v.Processing, "succeeded", v.Succeeded, "reason", v.Reason, "why", v.Message)
	}
	return err
}

// nodeOf finds the node a remediation is about: NodeHealthCheck names it after the node; Cluster
// API names it after its Machine, which owns it and names the node in status.nodeRef.
func (c *RemediationController) nodeOf(ctx context.Context, u *unstructured.Unstructured) (string, error) {
	for _, ref := range u.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil || ref.Kind != "Machine" || gv.Group != "cluster.x-k8s.io" {
			continue
		}
		m, err := c.dyn.Resource(gv.WithResource("machines")).Namespace(u.GetNamespace()).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("machine %s/%s: %w", u.GetNamespace(), ref.Name, err)
		}
		name, _, _ := unstructured.NestedString(m.Object, "status", "nodeRef", "name")
		return strings.TrimSpace(name), nil
	}
	return u.GetName(), nil
}

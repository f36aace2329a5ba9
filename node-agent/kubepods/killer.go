package kubepods

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// Kubelet's names for an eviction (pkg/kubelet/eviction and the core API).
const (
	// EvictedReason is the pod status reason and the Event reason of a node-pressure eviction.
	EvictedReason = "Evicted"
	// TerminationByKubeletReason is the DisruptionTarget condition's reason for it.
	TerminationByKubeletReason = "TerminationByKubelet"
	// EventSource is the component named in the Events the agent writes.
	EventSource = "nodefence-node-agent"
)

// resourceOf is kubelet's signalToResource.
func resourceOf(signal string) (ResourceName, resource.Format) {
	switch {
	case eviction.IsMemorySignal(signal):
		return ResourceMemory, resource.BinarySI
	case signal == eviction.SignalPIDAvailable:
		return "pids", resource.DecimalSI
	case strings.HasSuffix(signal, ".inodesFree"):
		return "inodes", resource.DecimalSI
	}
	return ResourceEphemeralStorage, resource.BinarySI
}

// EvictionMessage is kubelet's eviction message for r: "The node was low on resource: memory.
// Threshold quantity: 100Mi, available: 51200Ki. " (kubelet's nodeLowMessageFmt and
// thresholdMetMessageFmt; the per-container part needs per-container usage and is left out).
func EvictionMessage(r eviction.Reclaim) string {
	name, format := resourceOf(r.Threshold.Signal)
	q := resource.NewQuantity(r.Threshold.Value.Resolve(r.Observed.Capacity), format)
	a := resource.NewQuantity(r.Observed.Available, format)
	return fmt.Sprintf("The node was low on resource: %v. Threshold quantity: %v, available: %v. ", name, q, a)
}

// Killer evicts a pod on its own node at once, as kubelet's eviction manager does, through the API:
// the pod is deleted with the eviction's grace period (at least MinGracePeriod, see
// EvictorConfig) so that the kubelet stops its containers, an Evicted Warning Event is recorded
// on it, and its status is set to phase Failed with reason Evicted, kubelet's message and a
// DisruptionTarget condition (reason TerminationByKubelet). PodDisruptionBudgets are not consulted, as kubelet
// does not. It implements pressure.Killer and pressure.CleanupChecker.
type Killer struct {
	client *Client
	node   string
	src    *Source
	min    time.Duration
	log    *slog.Logger
}

// NewKiller returns a Killer for node's pods using client, which needs create on events, patch on
// pods/status and delete on pods. src (may be nil) answers CleanedUp from its cache and cgroups.
func NewKiller(client *Client, node string, src *Source, minGrace time.Duration, log *slog.Logger) *Killer {
	if minGrace <= 0 {
		minGrace = DefaultMinGracePeriod
	}
	if log == nil {
		log = slog.Default()
	}
	return &Killer{client: client, node: node, src: src, min: minGrace, log: log.With("component", "killer")}
}

// Kill evicts c for r and returns the eviction message. A pod that is gone (or whose name now
// belongs to another uid) is an error: nothing was evicted.
func (k *Killer) Kill(ctx context.Context, c eviction.Candidate, r eviction.Reclaim) (string, error) {
	msg := EvictionMessage(r)
	now := metav1.Now()

	// Delete first: the apiserver removes a pod whose phase is already Failed at once, whatever
	// the grace period, which would let a controller start its replacement (a StatefulSet, the
	// same identity) while the kubelet still runs the old containers.
	grace := gracePeriodSeconds(c.GracePeriod, k.min)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace}
	if c.UID != "" {
		uid := types.UID(c.UID)
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := k.client.DeletePod(ctx, c.Namespace, c.Name, opts); err != nil {
		return "", fmt.Errorf("terminating %s/%s: %w", c.Namespace, c.Name, err)
	}
	// The Event next, while the pod still exists (terminating for at least its grace period, and
	// its phase not yet Failed): the coordinator's admission webhook
	// (deploy/webhook-node-agent.yaml) admits an agent's Event about a pod only while that pod
	// exists and is bound to the agent's node. Kubelet records it before killing; the delete's uid
	// precondition comes first here so that an Event never names a pod that was not evicted.
	k.event(ctx, c, msg, now)
	status := map[string]any{
		"metadata": map[string]any{"uid": c.UID},
		"status": map[string]any{
			"phase": PodFailed, "reason": EvictedReason, "message": msg,
			"conditions": []any{map[string]any{
				"type": "DisruptionTarget", "status": "True", "reason": TerminationByKubeletReason,
				"message": msg, "lastTransitionTime": now.UTC().Format(time.RFC3339),
			}},
		},
	}
	patch, err := json.Marshal(status)
	if err != nil {
		return msg, err
	}
	if err := k.client.PatchPodStatus(ctx, c.Namespace, c.Name, patch); err != nil && !apierrors.IsNotFound(err) {
		// The pod is terminating already: the eviction happened, only its record is missing.
		k.log.Warn("setting the evicted status failed", "pod", c.Namespace+"/"+c.Name, "error", err)
	}
	return msg, nil
}

// event records the eviction on the pod, as kubelet's recorder does; a failure is only logged.
func (k *Killer) event(ctx context.Context, c eviction.Candidate, msg string, now metav1.Time) {
	ev := &Event{
		Metadata: metav1.ObjectMeta{Namespace: c.Namespace, GenerateName: c.Name + "."},
		InvolvedObject: ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name,
			UID: c.UID},
		Reason: EvictedReason, Message: msg, Type: "Warning",
		Source:         EventSourceRef{Component: EventSource, Host: k.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "nodefence.io/node-agent", ReportingInstance: k.node,
	}
	if err := k.client.CreateEvent(ctx, ev); err != nil {
		k.log.Warn("recording the eviction event failed", "pod", c.Namespace+"/"+c.Name, "error", err)
	}
}

// CleanedUp reports whether an evicted pod's resources are reclaimed, as kubelet's
// podCleanedUpFunc: the pod object is gone (or its name belongs to another uid) or the kubelet
// reports every container of it terminated, AND none of its volumes is still set up on the node
// (a memory-backed emptyDir holds its memory until it is torn down). Otherwise the caller waits,
// up to its cleanup timeout: a pod is never taken as cleaned up because the agent could not find
// its cgroup.
func (k *Killer) CleanedUp(_ context.Context, c eviction.Candidate) bool {
	if k.src == nil {
		return true
	}
	p, ok := k.src.store.get(c.Namespace, c.Name)
	if ok && string(p.UID) == c.UID && !containersTerminated(p) {
		return false
	}
	if v, ok := k.src.disk.(interface{ VolumesPresent(uid string) bool }); ok && v.VolumesPresent(c.UID) {
		return false
	}
	return true
}

// containersTerminated reports whether the pod has container statuses and all of them are
// terminated.
func containersTerminated(p *Pod) bool {
	all := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range all {
		if cs.State.Terminated == nil && (cs.State.Running != nil || cs.State.Waiting != nil) {
			return false
		}
	}
	return true
}

// Package kubepods is the node agent's Kubernetes mode: it knows the pods of its own node and acts
// on them through the API, never around it.
//
//   - Source lists the node's pods (an informer with the field selector spec.nodeName=<node>) and
//     turns each into an eviction.Pod: identity, priority, QoS class and requests computed as the
//     kubelet does, DaemonSet/static/critical markers, and the memory working set and process count
//     read from the pod's cgroup (Cgroups maps a pod to its cgroup for both drivers and both cgroup
//     versions), and its emptyDir and log disk use (Disk walks the kubelet's directories).
//   - Killer evicts on the node as kubelet's eviction manager does (hard thresholds, and soft ones
//     when no grant comes): the pod terminated, its status Failed/Evicted with a DisruptionTarget
//     condition, an Event.
//   - Evictor carries out the coordinator's eviction grants through the Eviction API (policy/v1),
//     so PodDisruptionBudgets are honoured: a 429 is retried later, never turned into a delete.
//   - Client is the slim REST client all of them use (core/v1 and policy/v1 only).
//   - Terminator deletes pods gracefully for the graceful node shutdown's phases, skipping
//     DaemonSet and static pods, and waits for them to be gone.
//
// The conversions (QoS, PodRequests, Convert, Cgroups.PodDir) are pure functions of the API
// objects; the types around them do the I/O.
package kubepods

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// SystemCriticalPriority is Kubernetes' scheduling.SystemCriticalPriority: pods at or above it are
// critical (system-cluster-critical and system-node-critical).
const SystemCriticalPriority = 2_000_000_000

// Annotations the kubelet puts on the pods it reads from files rather than the API.
const (
	// ConfigMirrorAnnotation marks a mirror pod: the API's view of a static pod.
	ConfigMirrorAnnotation = "kubernetes.io/config.mirror"
	// ConfigSourceAnnotation names where the kubelet got a pod; anything but "api" is static.
	ConfigSourceAnnotation = "kubernetes.io/config.source"
)

// qosResources are the resources the QoS class is computed from.
var qosResources = []ResourceName{ResourceCPU, ResourceMemory}

// QoS computes a pod's QoS class from its requests and limits the way the kubelet does
// (GetPodQOS): no CPU or memory request or limit in any container (init containers included) is
// BestEffort; every container having CPU and memory limits equal to its requests is Guaranteed;
// anything else is Burstable. Zero quantities count as unset. When the pod has pod-level resources
// (spec.resources), they decide instead of the containers'.
func QoS(pod *Pod) eviction.QoSClass {
	if r := pod.Spec.Resources; r != nil && hasQoSResource(r) {
		return qosOf([]ResourceRequirements{*r})
	}
	var all []ResourceRequirements
	for _, c := range pod.Spec.InitContainers {
		all = append(all, c.Resources)
	}
	for _, c := range pod.Spec.Containers {
		all = append(all, c.Resources)
	}
	return qosOf(all)
}

func hasQoSResource(r *ResourceRequirements) bool {
	for _, name := range qosResources {
		if q, ok := r.Requests[name]; ok && q.Sign() > 0 {
			return true
		}
		if q, ok := r.Limits[name]; ok && q.Sign() > 0 {
			return true
		}
	}
	return false
}

// qosOf applies the kubelet's rule to a list of resource requirements.
func qosOf(all []ResourceRequirements) eviction.QoSClass {
	requests := map[ResourceName]*resource.Quantity{}
	limits := map[ResourceName]*resource.Quantity{}
	add := func(m map[ResourceName]*resource.Quantity, name ResourceName, q resource.Quantity) {
		if cur, ok := m[name]; ok {
			cur.Add(q)
			return
		}
		c := q.DeepCopy()
		m[name] = &c
	}
	guaranteed := true
	for _, r := range all {
		for _, name := range qosResources {
			if q, ok := r.Requests[name]; ok && q.Sign() > 0 {
				add(requests, name, q)
			}
		}
		limited := 0
		for _, name := range qosResources {
			if q, ok := r.Limits[name]; ok && q.Sign() > 0 {
				add(limits, name, q)
				limited++
			}
		}
		if limited < len(qosResources) {
			guaranteed = false
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return eviction.BestEffort
	}
	if guaranteed {
		for name, req := range requests {
			if lim, ok := limits[name]; !ok || lim.Cmp(*req) != 0 {
				guaranteed = false
				break
			}
		}
	}
	if guaranteed && len(requests) == len(limits) {
		return eviction.Guaranteed
	}
	return eviction.Burstable
}

// PodRequests returns the pod's effective request of each resource, as the scheduler and the
// kubelet's eviction ranking count it: the regular containers and the sidecars (restartable init
// containers) run together; each other init container runs alone with the sidecars started before
// it; the larger of the two wins, and the pod overhead is added. Pod-level requests
// (spec.resources), when given, replace the containers' sum for the resources they name.
func PodRequests(pod *Pod) map[ResourceName]int64 {
	running := map[ResourceName]int64{}
	addTo := func(m map[ResourceName]int64, rl ResourceList) {
		for name, q := range rl {
			m[name] += q.Value()
		}
	}
	for _, c := range pod.Spec.Containers {
		addTo(running, c.Resources.Requests)
	}
	sidecars := map[ResourceName]int64{}
	initPeak := map[ResourceName]int64{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == ContainerRestartPolicyAlways {
			addTo(sidecars, c.Resources.Requests)
			for name, v := range sidecars {
				initPeak[name] = max(initPeak[name], v)
			}
			continue
		}
		for name, q := range c.Resources.Requests {
			initPeak[name] = max(initPeak[name], q.Value()+sidecars[name])
		}
	}
	out := map[ResourceName]int64{}
	for name, v := range running {
		out[name] = v
	}
	for name, v := range sidecars {
		out[name] += v
	}
	for name, v := range initPeak {
		out[name] = max(out[name], v)
	}
	if r := pod.Spec.Resources; r != nil {
		for name, q := range r.Requests {
			out[name] = q.Value()
		}
	}
	for name, q := range pod.Spec.Overhead {
		out[name] += q.Value()
	}
	for name, v := range out {
		if v == 0 {
			delete(out, name)
		}
	}
	return out
}

// IsDaemonSetPod reports whether a DaemonSet controls the pod.
func IsDaemonSetPod(pod *Pod) bool {
	for _, o := range pod.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// IsStaticPod reports whether the kubelet runs the pod from a file (the API shows it as a mirror
// pod).
func IsStaticPod(pod *Pod) bool {
	if _, ok := pod.Annotations[ConfigMirrorAnnotation]; ok {
		return true
	}
	src, ok := pod.Annotations[ConfigSourceAnnotation]
	return ok && src != "api"
}

// Priority is the pod's spec.priority, 0 when unset.
func Priority(pod *Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// IsCritical is the kubelet's IsCriticalPod: a static pod, or priority >= SystemCriticalPriority.
func IsCritical(pod *Pod) bool {
	return IsStaticPod(pod) || Priority(pod) >= SystemCriticalPriority
}

// DefaultTerminationGracePeriod is the API's default terminationGracePeriodSeconds.
const DefaultTerminationGracePeriod = 30 * time.Second

// Convert maps an API pod to an eviction.Pod without usage: identity, priority, QoS class,
// requests, grace period and the DaemonSet/static/critical markers. MemoryUsageUnknown is true
// until a cgroup reading fills MemoryUsage.
func Convert(pod *Pod) eviction.Pod {
	req := PodRequests(pod)
	grace := DefaultTerminationGracePeriod
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}
	return eviction.Pod{
		Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID),
		Priority: Priority(pod), QoS: QoS(pod), GracePeriod: grace,
		MemoryRequest:      req[ResourceMemory],
		StorageRequest:     req[ResourceEphemeralStorage],
		MemoryUsageUnknown: true,
		DaemonSet:          IsDaemonSetPod(pod),
		Static:             IsStaticPod(pod),
		Critical:           IsCritical(pod),
		Terminating:        pod.DeletionTimestamp != nil,
	}
}

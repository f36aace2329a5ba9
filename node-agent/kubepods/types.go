package kubepods

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The agent's own view of the core/v1 objects it reads and writes: only the fields it uses, with
// the API's JSON names, so the wire format is the API's and every other field is ignored. Why not
// k8s.io/api/core/v1: that package (and policy/v1) is several MB of generated code mapped into
// every agent for a handful of fields (make bench-agent).

// ResourceName is a resource's name in a ResourceList ("cpu", "memory", "ephemeral-storage").
type ResourceName string

// The resources the agent reads.
const (
	ResourceCPU              ResourceName = "cpu"
	ResourceMemory           ResourceName = "memory"
	ResourceEphemeralStorage ResourceName = "ephemeral-storage"
)

// ResourceList maps resources to quantities.
type ResourceList map[ResourceName]resource.Quantity

// Pod phases the agent reads or writes.
const (
	PodSucceeded = "Succeeded"
	PodFailed    = "Failed"
)

// ContainerRestartPolicyAlways marks a sidecar (a restartable init container).
const ContainerRestartPolicyAlways = "Always"

// Pod is the part of a core/v1 Pod the agent reads.
type Pod struct {
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodSpec   `json:"spec,omitempty"`
	Status            PodStatus `json:"status,omitempty"`
}

// PodSpec is the part of a pod's spec the agent reads.
type PodSpec struct {
	NodeName                      string                `json:"nodeName,omitempty"`
	Priority                      *int32                `json:"priority,omitempty"`
	TerminationGracePeriodSeconds *int64                `json:"terminationGracePeriodSeconds,omitempty"`
	InitContainers                []Container           `json:"initContainers,omitempty"`
	Containers                    []Container           `json:"containers,omitempty"`
	Overhead                      ResourceList          `json:"overhead,omitempty"`
	Resources                     *ResourceRequirements `json:"resources,omitempty"`
}

// Container is the part of a container's spec the agent reads.
type Container struct {
	Name          string               `json:"name"`
	Resources     ResourceRequirements `json:"resources,omitempty"`
	RestartPolicy *string              `json:"restartPolicy,omitempty"`
}

// ResourceRequirements are a container's (or the pod's) requests and limits.
type ResourceRequirements struct {
	Limits   ResourceList `json:"limits,omitempty"`
	Requests ResourceList `json:"requests,omitempty"`
}

// PodStatus is the part of a pod's status the agent reads.
type PodStatus struct {
	Phase                 string            `json:"phase,omitempty"`
	Reason                string            `json:"reason,omitempty"`
	QOSClass              string            `json:"qosClass,omitempty"`
	InitContainerStatuses []ContainerStatus `json:"initContainerStatuses,omitempty"`
	ContainerStatuses     []ContainerStatus `json:"containerStatuses,omitempty"`
}

// ContainerStatus is the part of a container's status the agent reads.
type ContainerStatus struct {
	Name  string         `json:"name"`
	State ContainerState `json:"state,omitempty"`
}

// ContainerState says which of its states a container is in; only presence is read.
type ContainerState struct {
	Waiting    *struct{} `json:"waiting,omitempty"`
	Running    *struct{} `json:"running,omitempty"`
	Terminated *struct{} `json:"terminated,omitempty"`
}

// podList is a list of pods.
type podList struct {
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pod `json:"items"`
}

// Event is a core/v1 Event as the agent writes it.
type Event struct {
	APIVersion          string            `json:"apiVersion"`
	Kind                string            `json:"kind"`
	Metadata            metav1.ObjectMeta `json:"metadata"`
	InvolvedObject      ObjectReference   `json:"involvedObject"`
	Reason              string            `json:"reason,omitempty"`
	Message             string            `json:"message,omitempty"`
	Source              EventSourceRef    `json:"source,omitempty"`
	FirstTimestamp      metav1.Time       `json:"firstTimestamp,omitempty"`
	LastTimestamp       metav1.Time       `json:"lastTimestamp,omitempty"`
	Count               int32             `json:"count,omitempty"`
	Type                string            `json:"type,omitempty"`
	ReportingController string            `json:"reportingComponent"`
	ReportingInstance   string            `json:"reportingInstance"`
}

// ObjectReference names the object an event is about.
type ObjectReference struct {
	Kind       string `json:"kind,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name,omitempty"`
	UID        string `json:"uid,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}

// EventSourceRef is the component (and host) that reports an event.
type EventSourceRef struct {
	Component string `json:"component,omitempty"`
	Host      string `json:"host,omitempty"`
}

// Eviction is a policy/v1 Eviction as the agent sends it.
type Eviction struct {
	APIVersion    string                `json:"apiVersion"`
	Kind          string                `json:"kind"`
	Metadata      metav1.ObjectMeta     `json:"metadata"`
	DeleteOptions *metav1.DeleteOptions `json:"deleteOptions,omitempty"`
}

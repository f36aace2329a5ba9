package kubepods

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// rl builds a ResourceList from name=quantity pairs.
func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func ctr(req, lim corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}
}

// TestQoS is the kubelet's QoS rule, case by case.
func TestQoS(t *testing.T) {
	tests := []struct {
		name       string
		containers []corev1.Container
		init       []corev1.Container
		podLevel   *corev1.ResourceRequirements
		want       eviction.QoSClass
	}{
		{"nothing", []corev1.Container{ctr(nil, nil)}, nil, nil, eviction.BestEffort},
		{"only storage", []corev1.Container{ctr(rl("ephemeral-storage", "1Gi"), rl("ephemeral-storage", "1Gi"))}, nil, nil, eviction.BestEffort},
		{"zero quantities are unset", []corev1.Container{ctr(rl("cpu", "0", "memory", "0"), nil)}, nil, nil, eviction.BestEffort},
		{"limits equal requests", []corev1.Container{ctr(rl("cpu", "1", "memory", "1Gi"), rl("cpu", "1", "memory", "1Gi"))}, nil, nil, eviction.Guaranteed},
		{"equal in other units", []corev1.Container{ctr(rl("cpu", "1000m", "memory", "1024Mi"), rl("cpu", "1", "memory", "1Gi"))}, nil, nil, eviction.Guaranteed},
		{"limits only (requests defaulted by the API)", []corev1.Container{ctr(nil, rl("cpu", "1", "memory", "1Gi"))}, nil, nil, eviction.Burstable},
		{"memory limit above request", []corev1.Container{ctr(rl("cpu", "1", "memory", "1Gi"), rl("cpu", "1", "memory", "2Gi"))}, nil, nil, eviction.Burstable},
		{"no cpu limit", []corev1.Container{ctr(rl("cpu", "1", "memory", "1Gi"), rl("memory", "1Gi"))}, nil, nil, eviction.Burstable},
		{"request only", []corev1.Container{ctr(rl("memory", "100Mi"), nil)}, nil, nil, eviction.Burstable},
		{"one of two containers guaranteed", []corev1.Container{
			ctr(rl("cpu", "1", "memory", "1Gi"), rl("cpu", "1", "memory", "1Gi")), ctr(nil, nil)}, nil, nil, eviction.Burstable},
		{"both containers guaranteed", []corev1.Container{
			ctr(rl("cpu", "1", "memory", "1Gi"), rl("cpu", "1", "memory", "1Gi")),
			ctr(rl("cpu", "500m", "memory", "10Mi"), rl("cpu", "500m", "memory", "10Mi"))}, nil, nil, eviction.Guaranteed},
		{"best-effort init container breaks guaranteed", []corev1.Container{
			ctr(rl("cpu", "1", "memory", "1Gi"), rl("cpu", "1", "memory", "1Gi"))}, []corev1.Container{ctr(nil, nil)}, nil, eviction.Burstable},
		{"init container alone makes burstable", []corev1.Container{ctr(nil, nil)}, []corev1.Container{ctr(rl("memory", "1Gi"), nil)}, nil, eviction.Burstable},
		{"pod-level resources decide", []corev1.Container{ctr(nil, nil)}, nil,
			&corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi"), Limits: rl("cpu", "1", "memory", "1Gi")}, eviction.Guaranteed},
		{"pod-level without cpu/memory is ignored", []corev1.Container{ctr(rl("memory", "1Gi"), nil)}, nil,
			&corev1.ResourceRequirements{Requests: rl("hugepages-2Mi", "2Mi")}, eviction.Burstable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: tt.containers, InitContainers: tt.init, Resources: tt.podLevel}}
			if got := QoS(local(t, pod)); got != tt.want {
				t.Errorf("QoS = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestPodRequests(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	sidecar := func(req corev1.ResourceList) corev1.Container {
		c := ctr(req, nil)
		c.RestartPolicy = &always
		return c
	}
	tests := []struct {
		name string
		spec corev1.PodSpec
		want map[ResourceName]int64
	}{
		{"containers add up", corev1.PodSpec{Containers: []corev1.Container{
			ctr(rl("memory", "100Mi", "ephemeral-storage", "1Gi"), nil), ctr(rl("memory", "50Mi", "cpu", "250m"), nil)}},
			map[ResourceName]int64{"memory": 150 << 20, "ephemeral-storage": 1 << 30, "cpu": 1}},
		{"a bigger init container wins", corev1.PodSpec{
			InitContainers: []corev1.Container{ctr(rl("memory", "1Gi"), nil)},
			Containers:     []corev1.Container{ctr(rl("memory", "100Mi"), nil)}},
			map[ResourceName]int64{"memory": 1 << 30}},
		{"sidecars run with the containers and later init containers", corev1.PodSpec{
			InitContainers: []corev1.Container{sidecar(rl("memory", "100Mi")), ctr(rl("memory", "200Mi"), nil)},
			Containers:     []corev1.Container{ctr(rl("memory", "50Mi"), nil)}},
			map[ResourceName]int64{"memory": 300 << 20}},
		{"overhead is added", corev1.PodSpec{Containers: []corev1.Container{ctr(rl("memory", "100Mi"), nil)}, Overhead: rl("memory", "10Mi")},
			map[ResourceName]int64{"memory": 110 << 20}},
		{"pod-level requests replace", corev1.PodSpec{Containers: []corev1.Container{ctr(rl("memory", "100Mi"), nil)},
			Resources: &corev1.ResourceRequirements{Requests: rl("memory", "1Gi")}},
			map[ResourceName]int64{"memory": 1 << 30}},
		{"nothing", corev1.PodSpec{Containers: []corev1.Container{ctr(nil, nil)}}, map[ResourceName]int64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, PodRequests(local(t, &corev1.Pod{Spec: tt.spec}))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestConvertMarkers(t *testing.T) {
	yes := true
	prio := func(p int32) *int32 { return &p }
	grace := int64(45)
	tests := []struct {
		name string
		pod  corev1.Pod
		want eviction.Pod
	}{
		{"plain", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u"},
			Spec: corev1.PodSpec{Priority: prio(1000), TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{ctr(rl("memory", "1Gi", "ephemeral-storage", "2Gi"), nil)}}},
			eviction.Pod{Namespace: "ns", Name: "p", UID: "u", Priority: 1000, QoS: eviction.Burstable, GracePeriod: 45 * time.Second,
				MemoryRequest: 1 << 30, StorageRequest: 2 << 30, MemoryUsageUnknown: true}},
		{"daemonset", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ds", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "d", Controller: &yes}}}},
			eviction.Pod{Name: "ds", QoS: eviction.BestEffort, GracePeriod: 30 * time.Second, MemoryUsageUnknown: true, DaemonSet: true}},
		{"daemonset owner that is not the controller", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "d"}}}},
			eviction.Pod{Name: "x", QoS: eviction.BestEffort, GracePeriod: 30 * time.Second, MemoryUsageUnknown: true}},
		{"mirror pod", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-n1", Annotations: map[string]string{
			ConfigMirrorAnnotation: "abc", ConfigSourceAnnotation: "file"}}},
			eviction.Pod{Name: "etcd-n1", QoS: eviction.BestEffort, GracePeriod: 30 * time.Second, MemoryUsageUnknown: true, Static: true, Critical: true}},
		{"system-node-critical", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: corev1.PodSpec{Priority: prio(2000001000)}},
			eviction.Pod{Name: "c", Priority: 2000001000, QoS: eviction.BestEffort, GracePeriod: 30 * time.Second, MemoryUsageUnknown: true, Critical: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Convert(local(t, &tt.pod))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestContainersTerminated: a pod counts as cleaned up only when the kubelet reports every
// container terminated; no statuses (nothing reported yet) is not cleaned up.
func TestContainersTerminated(t *testing.T) {
	term := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
	run := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for name, tc := range map[string]struct {
		init, main []corev1.ContainerState
		want       bool
	}{
		"no statuses":        {nil, nil, false},
		"all terminated":     {[]corev1.ContainerState{term}, []corev1.ContainerState{term, term}, true},
		"one still running":  {nil, []corev1.ContainerState{term, run}, false},
		"init still running": {[]corev1.ContainerState{run}, []corev1.ContainerState{term}, false},
	} {
		p := &corev1.Pod{}
		for _, s := range tc.init {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{State: s})
		}
		for _, s := range tc.main {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{State: s})
		}
		if got := containersTerminated(local(t, p)); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

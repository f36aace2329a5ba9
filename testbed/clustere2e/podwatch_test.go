package clustere2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// podWatch records every state a watch showed of the pods of a label selector, with when it came.
type podWatch struct {
	mu     sync.Mutex
	states map[types.UID][]seen
}

type seen struct {
	at   time.Time
	kind watch.EventType
	pod  *corev1.Pod
}

// watchPods starts recording the pods of selector in the default namespace until the test ends.
func (s *scenario) watchPods(selector string) *podWatch {
	s.t.Helper()
	ctx, cancel := context.WithCancel(s.ctx)
	s.t.Cleanup(cancel)
	timeout := int64(600)
	wi, err := s.admin.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: selector, TimeoutSeconds: &timeout})
	if err != nil {
		s.t.Fatal(err)
	}
	w := &podWatch{states: map[types.UID][]seen{}}
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Error {
				continue
			}
			w.mu.Lock()
			w.states[p.UID] = append(w.states[p.UID], seen{at: time.Now(), kind: ev.Type, pod: p})
			w.mu.Unlock()
		}
	}()
	return w
}

// waitPod waits for a pod state that satisfies ok and returns it.
func (w *podWatch) waitPod(t *testing.T, timeout time.Duration, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		w.mu.Lock()
		for _, ss := range w.states {
			if last := ss[len(ss)-1].pod; ok(last) {
				w.mu.Unlock()
				return last
			}
		}
		w.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no pod as wanted within %s", timeout)
		}
	}
}

// evictedAt is when the pod was first seen terminating (a deletion timestamp) or failed.
func (w *podWatch) evictedAt(uid types.UID) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.states[uid] {
		if s.pod.DeletionTimestamp != nil || s.pod.Status.Phase == corev1.PodFailed {
			return s.at, true
		}
	}
	return time.Time{}, false
}

func (w *podWatch) waitEvicted(t *testing.T, uid types.UID, timeout time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		if at, ok := w.evictedAt(uid); ok {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not evicted within %s", uid, timeout)
		}
	}
}

// waitGone waits until the pod is deleted: its states are complete.
func (w *podWatch) waitGone(t *testing.T, uid types.UID, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		w.mu.Lock()
		ss := w.states[uid]
		gone := len(ss) > 0 && ss[len(ss)-1].kind == watch.Deleted
		w.mu.Unlock()
		if gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not deleted within %s", uid, timeout)
		}
	}
}

// merged is the pod's last state with every condition and the first Failed status any state
// showed (the kubelet rewrites the status as it stops the pod).
func (w *podWatch) merged(uid types.UID) *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	ss := w.states[uid]
	if len(ss) == 0 {
		return &corev1.Pod{}
	}
	out := ss[len(ss)-1].pod.DeepCopy()
	conds := map[corev1.PodConditionType]corev1.PodCondition{}
	failed := false
	for _, s := range ss {
		for _, c := range s.pod.Status.Conditions {
			if _, ok := conds[c.Type]; !ok {
				conds[c.Type] = c
			}
		}
		if !failed && s.pod.Status.Phase == corev1.PodFailed {
			failed = true
			out.Status.Phase, out.Status.Reason, out.Status.Message = s.pod.Status.Phase, s.pod.Status.Reason, s.pod.Status.Message
		}
	}
	out.Status.Conditions = nil
	for _, c := range conds {
		out.Status.Conditions = append(out.Status.Conditions, c)
	}
	return out
}

// sinceStart is how long after the pod's container started at happened.
func (w *podWatch) sinceStart(uid types.UID, at time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.states[uid] {
		for _, cs := range s.pod.Status.ContainerStatuses {
			if r := cs.State.Running; r != nil {
				return at.Sub(r.StartedAt.Time).Round(time.Millisecond)
			}
		}
	}
	return -1
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func gapsOf(ts []time.Time) string {
	var out []string
	for _, t := range ts[1:] {
		out = append(out, "+"+t.Sub(ts[0]).Round(time.Millisecond).String())
	}
	return strings.Join(out, ", ")
}

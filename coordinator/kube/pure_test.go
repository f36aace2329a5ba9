package kube

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEditTaints(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	earlier := metav1.NewTime(now.Add(-time.Hour))
	nr := corev1.Taint{Key: TaintKeyNotReady, Effect: corev1.TaintEffectNoExecute}
	nrSched := corev1.Taint{Key: TaintKeyNotReady, Effect: corev1.TaintEffectNoSchedule}
	un := corev1.Taint{Key: TaintKeyUnreachable, Effect: corev1.TaintEffectNoExecute}
	stamped := func(t corev1.Taint, at metav1.Time) corev1.Taint { t.TimeAdded = &at; return t }
	for _, tc := range []struct {
		name        string
		have        []corev1.Taint
		add, remove []corev1.Taint
		want        []corev1.Taint
		changed     bool
	}{
		{"add to none", nil, []corev1.Taint{nr}, nil, []corev1.Taint{stamped(nr, now)}, true},
		{"add present keeps time", []corev1.Taint{stamped(nr, earlier)}, []corev1.Taint{nr}, nil, []corev1.Taint{stamped(nr, earlier)}, false},
		{"swap", []corev1.Taint{nrSched, stamped(nr, earlier)}, []corev1.Taint{un}, []corev1.Taint{nr}, []corev1.Taint{nrSched, stamped(un, now)}, true},
		{"remove only that effect", []corev1.Taint{nrSched, nr}, nil, []corev1.Taint{nr}, []corev1.Taint{nrSched}, true},
		{"remove absent", []corev1.Taint{nrSched}, nil, []corev1.Taint{un}, []corev1.Taint{nrSched}, false},
		{"add wins over remove", []corev1.Taint{nr}, []corev1.Taint{nr}, []corev1.Taint{nr}, []corev1.Taint{nr}, false},
		{"remove all", []corev1.Taint{nr}, nil, []corev1.Taint{nr}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := EditTaints(tc.have, tc.add, tc.remove, now)
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("taints (-want +got):\n%s", d)
			}
		})
	}
}

func TestReleasableAndStatefulPods(t *testing.T) {
	taint := OutOfServiceTaint()
	pod := func(mutate ...func(*corev1.Pod)) *corev1.Pod {
		p := testPod("ns", "p", "n", nil)
		for _, m := range mutate {
			m(p)
		}
		return p
	}
	tol := func(key string, op corev1.TolerationOperator, value string, effect corev1.TaintEffect) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: op, Value: value, Effect: effect})
		}
	}
	phase := func(ph corev1.PodPhase) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Status.Phase = ph } }
	extensionsDS := func(p *corev1.Pod) {
		ownedByKind("DaemonSet")(p)
		p.OwnerReferences[0].APIVersion = "example.com/v1"
	}
	for _, tc := range []struct {
		name                 string
		pod                  *corev1.Pod
		releasable, stateful bool
	}{
		{"bare", pod(), true, false},
		{"statefulset", pod(ownedByKind("StatefulSet")), true, true},
		{"pvc", pod(withPVC("c")), true, true},
		{"daemonset", pod(ownedByKind("DaemonSet")), false, false},
		{"daemonset with pvc", pod(ownedByKind("DaemonSet"), withPVC("c")), false, false},
		{"other group's DaemonSet kind", pod(extensionsDS), true, false},
		{"tolerates exists", pod(tol(TaintKeyOutOfService, corev1.TolerationOpExists, "", corev1.TaintEffectNoExecute)), false, false},
		{"tolerates everything", pod(tol("", corev1.TolerationOpExists, "", "")), false, false},
		{"tolerates equal value", pod(tol(TaintKeyOutOfService, corev1.TolerationOpEqual, OutOfServiceValue, "")), false, false},
		{"other value", pod(tol(TaintKeyOutOfService, corev1.TolerationOpEqual, "other", corev1.TaintEffectNoExecute)), true, false},
		{"NoSchedule only", pod(tol(TaintKeyOutOfService, corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule)), true, false},
		{"succeeded", pod(withPVC("c"), phase(corev1.PodSucceeded)), false, false},
		{"failed", pod(ownedByKind("StatefulSet"), phase(corev1.PodFailed)), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReleasablePod(tc.pod, &taint); got != tc.releasable {
				t.Errorf("ReleasablePod = %v, want %v", got, tc.releasable)
			}
			if got := StatefulPod(tc.pod); got != tc.stateful {
				t.Errorf("StatefulPod = %v, want %v", got, tc.stateful)
			}
		})
	}
}

func TestFenceObjectName(t *testing.T) {
	for id, want := range map[string]string{
		"host1-20261122T100000.000000000":                      "host1-20261122t100000.000000000",
		"k8s-cluster-host1.example.com-20261122T100000.000000": "k8s-cluster-host1.example.com-20261122t100000.000000",
		"":          "",
		"bad/slash": "",
	} {
		got, err := FenceObjectName(id)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("FenceObjectName(%q) = %q, %v; want %q", id, got, err, want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for s, want := range map[string]Policy{"": PolicyStateful, "stateful": PolicyStateful, "all": PolicyAll} {
		if got, err := ParsePolicy(s); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v", s, got, err)
		}
	}
	for _, s := range []string{"All", "none", "statefulsets"} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("ParsePolicy(%q): no error", s)
		}
	}
}

package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeInputModes: the Node's fence-mode annotation and exclude-from-fencing label reach the
// engine; an annotation value that is neither mode observes the node and says why.
func TestNodeInputModes(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	node := func(labels, annotations map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: annotations}}
	}
	for _, tc := range []struct {
		name             string
		n                *corev1.Node
		observe, exclude bool
		note             string
	}{
		{"none", node(nil, nil), false, false, ""},
		{"observe", node(nil, map[string]string{AnnotationFenceMode: "observe"}), true, false, ""},
		{"enforce follows the flag", node(nil, map[string]string{AnnotationFenceMode: "enforce"}), false, false, ""},
		{"a typo observes", node(nil, map[string]string{AnnotationFenceMode: "obsrve"}), true, false, `annotation nodefence.io/fence-mode: fence mode "obsrve": want observe or enforce`},
		{"the label excludes, any value", node(map[string]string{LabelExcludeFencing: ""}, nil), false, true, ""},
		{"the label as an annotation does nothing", node(nil, map[string]string{LabelExcludeFencing: "true"}), false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NodeInput(tc.n, true, nil, at)
			if c.Observe != tc.observe || c.ExcludeFencing != tc.exclude || !strings.HasPrefix(c.ModeNote, tc.note) || (tc.note == "") != (c.ModeNote == "") {
				t.Errorf("NodeInput = observe %v exclude %v note %q; want %v %v %q", c.Observe, c.ExcludeFencing, c.ModeNote, tc.observe, tc.exclude, tc.note)
			}
		})
	}
}

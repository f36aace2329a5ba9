package kubescenario

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
)

func TestForeignNodeFields(t *testing.T) {
	entry := func(manager, op, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationType(op),
			FieldsV1: metav1.NewFieldsV1(fields)}
	}
	own := `{"f:status":{"f:conditions":{"k:{\"type\":\"nodefence.io/AgentReady\"}":{".":{},"f:status":{},"f:type":{}}}}}`
	ready := `{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{}}},"f:capacity":{"f:cpu":{}}}}`
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{
		entry(kube.FieldManager, "Apply", own),
		entry(kube.FieldManager, "Update", `{"f:spec":{"f:taints":{}}}`),
		entry("kubelet", "Update", ready),
	}}}
	if got, err := ForeignNodeFields(node); err != nil || len(got) != 0 {
		t.Errorf("own fields: %q, %v; want none", got, err)
	}
	node.ManagedFields = append(node.ManagedFields, entry(kube.FieldManager, "Update", ready))
	got, err := ForeignNodeFields(node)
	want := []string{`Update f:status.f:capacity.f:cpu`, `Update f:status.f:conditions.k:{"type":"Ready"}..`,
		`Update f:status.f:conditions.k:{"type":"Ready"}.f:status`}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Ready and capacity owned: %q, %v; want %q", got, err, want)
	}
	node.ManagedFields = []metav1.ManagedFieldsEntry{entry(kube.FieldManager, "Update", "{")}
	if _, err := ForeignNodeFields(node); err == nil {
		t.Error("malformed managedFields: no error")
	}
}

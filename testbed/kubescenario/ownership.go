package kubescenario

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
)

// agentReadyKey is the managedFields key of nodefence's own Node condition.
var agentReadyKey = `k:{"type":"` + string(kube.ConditionAgentReady) + `"}`

// ForeignNodeFields lists the fields of node that nodefence's field manager owns although they
// are not its own: anything but the taint list (where it adds and removes only the out-of-service
// taint; Node.spec.taints is an atomic list, owned whole by its last writer) and its condition
// nodefence.io/AgentReady. Ready, the pressure conditions, addresses, capacity and the rest belong to
// kubelet and kube-controller-manager. Each entry reads "<operation> <path>".
func ForeignNodeFields(node corev1.Node) ([]string, error) {
	var out []string
	for _, mf := range node.ManagedFields {
		if mf.Manager != kube.FieldManager || mf.FieldsV1 == nil {
			continue
		}
		var tree map[string]any
		if err := json.Unmarshal(mf.FieldsV1.GetRawBytes(), &tree); err != nil {
			return nil, fmt.Errorf("node %s managedFields of %s: %w", node.Name, mf.Manager, err)
		}
		for _, p := range leafPaths(nil, tree) {
			if !ownField(p) {
				out = append(out, fmt.Sprintf("%s %s", mf.Operation, strings.Join(p, ".")))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// ownField reports whether a managedFields path is one nodefence may own on a Node.
func ownField(p []string) bool {
	switch {
	case len(p) >= 2 && p[0] == "f:spec" && p[1] == "f:taints":
		return true
	case len(p) >= 3 && p[0] == "f:status" && p[1] == "f:conditions" && p[2] == agentReadyKey:
		return true
	}
	return false
}

// leafPaths lists the paths to the leaves of a managedFields tree (an empty object is a leaf).
func leafPaths(prefix []string, tree map[string]any) [][]string {
	if len(tree) == 0 {
		return [][]string{append([]string{}, prefix...)}
	}
	var out [][]string
	for k, v := range tree {
		p := append(append([]string{}, prefix...), k)
		sub, _ := v.(map[string]any)
		out = append(out, leafPaths(p, sub)...)
	}
	return out
}

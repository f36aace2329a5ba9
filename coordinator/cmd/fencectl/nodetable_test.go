package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A node whose agent and kubelet are both silent past their windows says so in `fencectl status
// NODE`, while its readiness is still Ready by the grace; a reporting node has no such row.
func TestNodeTableShowsSilence(t *testing.T) {
	n := &coordv1.Node{Name: "node-2", Readiness: coordv1.Readiness_READINESS_READY}
	if row := findRow(nodeTable(n, nil), "silent:"); row != "" {
		t.Fatalf("reporting node: unexpected row %q", row)
	}
	n.SilentSince = timestamppb.New(time.Now().Add(-4 * time.Second))
	row := findRow(nodeTable(n, nil), "silent:")
	if !strings.Contains(row, "agent and kubelet silent past their own windows") {
		t.Fatalf("silent node: row %q", row)
	}
}

func findRow(t table, key string) string {
	for _, r := range t.rows {
		if len(r) > 1 && r[0] == key {
			return r[1]
		}
	}
	return ""
}

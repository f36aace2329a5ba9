package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// startLeader runs a standalone coordinator (embedded etcd, no client certificates: the caller is
// "any") with two configured nodes in zone a that no agent ever connects for, and waits until it
// leads. It returns the app and a connection to it.
func startLeader(t *testing.T) (*App, *grpc.ClientConn) {
	t.Helper()
	insecure := tlsfiles.Files{Insecure: true}
	fences := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(fences, []byte(`drivers:
  ipmi: {endpoint: "127.0.0.1:1"}
templates:
  bmc: {driver: ipmi, parameters: {username: admin, ip: 127.0.0.1}}
nodes:
  node-1: {zone: a, methods: {bmc: {template: bmc, parameters: {password: secret}}}, steps: {power_management: [bmc]}}
  node-2: {zone: a, methods: {bmc: {template: bmc, parameters: {password: secret}}}, steps: {power_management: [bmc]}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{
		Server:    server.Config{Listen: "127.0.0.1:0", TLS: insecure, UnauthenticatedCaller: "any", DrainTimeout: time.Second},
		DriverTLS: insecure, FenceConfig: fences, DataDir: t.TempDir(),
		EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	cc, err := dial.New(a.Addr(), insecure)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cluster := coordv1.NewClusterServiceClient(cc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		gl, err := cluster.GetLeader(rctx, &coordv1.GetLeaderRequest{})
		rcancel()
		if err == nil && gl.IsSelf {
			return a, cc
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the coordinator elects itself
	}
}

// metricValue gathers the app's registry and returns the value of the series name{labels...}
// (labels as name=value pairs, all of which must match), and whether it exists.
func metricValue(t *testing.T, a *App, name string, labels ...string) (float64, bool) {
	t.Helper()
	families, err := a.srv.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			match := true
			for _, p := range labels {
				k, v, _ := strings.Cut(p, "=")
				match = match && have[k] == v
			}
			switch {
			case !match:
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			}
		}
	}
	return 0, false
}

// An operator's Acknowledge goes through the same hook as every record the runner writes: it is
// counted in nodefence_fence_acknowledgements_total (the alert NodefenceFenceAcknowledgedByHand
// reads it), finished in nodefence_fences_finished_total, written to the audit trail as a fence
// record change, and reaches the engine's view of the node.
func TestAcknowledgeIsCountedAndAudited(t *testing.T) {
	a, cc := startLeader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v, ok := metricValue(t, a, "nodefence_fence_acknowledgements_total"); !ok || v != 0 {
		t.Fatalf("before: nodefence_fence_acknowledgements_total = %v (present %v), want 0", v, ok)
	}
	r, err := coordv1.NewFenceServiceClient(cc).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-1", Operator: "alice", Reason: "pulled the plug", Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := metricValue(t, a, "nodefence_fence_acknowledgements_total"); v != 1 {
		t.Errorf("nodefence_fence_acknowledgements_total = %v after an acknowledgement, want 1", v)
	}
	if v, _ := metricValue(t, a, "nodefence_fences_finished_total", "action=off", "result=done"); v != 1 {
		t.Errorf(`nodefence_fences_finished_total{action="off",result="done"} = %v, want 1`, v)
	}
	cluster := coordv1.NewClusterServiceClient(cc)
	// The record's change reaches the audit trail through the term's audit writer, apart from the
	// record's own write: wait for it.
	var joined string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		audit, err := cluster.ListAudit(ctx, &coordv1.ListAuditRequest{Node: "node-1"})
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range audit.Entries {
			kinds = append(kinds, e.Kind+": "+e.Text)
		}
		joined = strings.Join(kinds, "\n")
		if strings.Contains(joined, "acknowledge: ") && strings.Contains(joined, "fence: fence "+r.Fence.Id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit of node-1 lacks the acknowledgement or the record's change:\n%s", joined)
		}
	}
	n, err := cluster.GetNode(ctx, &coordv1.GetNodeRequest{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.Node.Reason, "powered off: fence "+r.Fence.Id) {
		t.Errorf("the engine's view of node-1 does not know it is off: %q", n.Node.Reason)
	}
	// A second acknowledgement of the same node makes a new record: counted once more. (The nodes
	// are forced: a node never heard of is within its startup grace period.)
	if _, err := coordv1.NewFenceServiceClient(cc).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-1", Reason: "again", Force: true}); err != nil {
		t.Fatal(err)
	}
	if v, _ := metricValue(t, a, "nodefence_fence_acknowledgements_total"); v != 2 {
		t.Errorf("nodefence_fence_acknowledgements_total = %v after two acknowledgements, want 2", v)
	}
}

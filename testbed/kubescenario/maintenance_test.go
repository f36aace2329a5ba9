package kubescenario

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/promscrape"
	"github.com/nodefence/nodefence/testbed/testlog"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestMaintenanceHoldsTheFence drives fencectl maintenance's calls against a real kube-apiserver:
// a cluster-wide pause and resume reach every Node as Events; StartMaintenance (no drain) cordons
// the victim and is audited with the operator's identity; the victim then dies and is NOT fenced
// while in maintenance, although its witnesses are silent far past their windows; StopMaintenance
// uncordons it, and the automatic fence proceeds at once: confirmed off, the pod released.
func TestMaintenanceHoldsTheFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 3, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	conn, err := env.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cluster := coordv1.NewClusterServiceClient(conn)

	// The pause is on every Node's Events, with who paused and why.
	if _, err := cluster.PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: "storage upgrade"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.ResumeEvictions(ctx, &coordv1.ResumeEvictionsRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range env.Nodes {
		waitEvents(ctx, t, env, n.Name, "NodefencePaused", "NodefenceResumed")
	}
	if msg := eventMessage(ctx, t, env, env.Nodes[0].Name, "NodefencePaused"); !strings.Contains(msg, "operator/scenario") || !strings.Contains(msg, "storage upgrade") {
		t.Errorf("the pause Event does not say who paused and why: %q", msg)
	}

	victim := env.Nodes[len(env.Nodes)-1]
	r, err := cluster.StartMaintenance(ctx, &coordv1.StartMaintenanceRequest{Node: victim.Name, Reason: "firmware", NoDrain: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := r.Maintenance; !m.Active || !m.Cordoned || m.Drain || m.Reason != "firmware" || m.Requester != "spiffe://nodefence/operator/scenario" && m.Requester != "operator/scenario" {
		t.Fatalf("StartMaintenance answered %v", m)
	}
	if _, err := cluster.StartMaintenance(ctx, &coordv1.StartMaintenanceRequest{Node: victim.Name}); err == nil || !strings.Contains(err.Error(), "reason") {
		t.Fatalf("a maintenance without a reason: %v, want an error naming reason", err)
	}
	waitEvents(ctx, t, env, victim.Name, "Maintenance")

	failed := env.Fail(victim)
	// The kubelet stand-in renews every 200 ms and the agent beats every few hundred: ten seconds is
	// many times both witnesses' windows plus grace and fence timeout.
	for deadline := failed.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if recs := env.Fences(ctx, victim.Name); len(recs) > 0 {
			t.Fatalf("%s fenced while in maintenance: %v", victim.Name, recs)
		}
	}
	assertUntouched(ctx, t, env, victim)
	if msg := eventMessage(ctx, t, env, victim.Name, "FenceHeldBack"); !strings.Contains(msg, "maintenance") {
		t.Errorf("no FenceHeldBack Event naming the maintenance: %q", msg)
	}

	stop, err := cluster.StopMaintenance(ctx, &coordv1.StopMaintenanceRequest{Node: victim.Name})
	if err != nil {
		t.Fatal(err)
	}
	if m := stop.Maintenance; m.Active || m.Cordoned {
		t.Fatalf("StopMaintenance answered %v", m)
	}
	stopped := time.Now()
	rec := waitRecord(ctx, t, env, victim.Name, 30*time.Second, func(f *coordv1.NodeFence) bool { return f.ConfirmedOffAt != nil })
	if !rec.Automatic {
		t.Errorf("the fence after the maintenance is not the automatic one: %v", rec)
	}
	if _, err := env.WaitReleased(ctx, victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: fenced and released %.1fs after its maintenance ended", victim.Name, time.Since(stopped).Seconds())

	// The recovery's phases are measured from the node's last contact.
	m, err := promscrape.Get("http://" + env.Coord.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, phase := range []string{"not-ready", "decision", "confirmed-off", "released"} {
		if n := m[`nodefence_recovery_seconds_count{phase="`+phase+`"}`]; n != 1 {
			t.Errorf("nodefence_recovery_seconds{phase=%q} observed %v times, want once", phase, n)
		}
	}
	// The audit writer appends in the background: the end's entry may follow the answer by a moment.
	wait.Until(t, 10*time.Second, "the audit trail of "+victim.Name+" holds the maintenance's start and end", func() error {
		audit, err := cluster.ListAudit(ctx, &coordv1.ListAuditRequest{Node: victim.Name})
		if err != nil {
			return err
		}
		var started, ended bool
		for _, a := range audit.Entries {
			started = started || a.Kind == "maintenance" && strings.Contains(a.Text, "started by") && strings.Contains(a.Text, "operator/scenario") && strings.Contains(a.Text, "firmware")
			ended = ended || a.Kind == "maintenance" && strings.Contains(a.Text, "ended by")
		}
		if !started || !ended {
			return fmt.Errorf("start %v, end %v: %v", started, ended, audit.Entries)
		}
		return nil
	})
	if n, err := env.Admin.CoreV1().Nodes().Get(ctx, victim.Name, metav1.GetOptions{}); err != nil || n.Annotations[kube.AnnotationMaintenance] != "" {
		t.Fatalf("%s after stop: %v %v", victim.Name, err, n.GetAnnotations())
	}
}

// eventMessage is the message of the newest Event of reason on the Node ("" when there is none).
func eventMessage(ctx context.Context, t *testing.T, env *Env, node, reason string) string {
	t.Helper()
	evs, err := env.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	msg, at := "", time.Time{}
	for _, ev := range evs.Items {
		if ev.Reason == reason && !ev.LastTimestamp.Time.Before(at) {
			msg, at = ev.Message, ev.LastTimestamp.Time
		}
	}
	return msg
}

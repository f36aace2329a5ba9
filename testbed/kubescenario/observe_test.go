package kubescenario

import (
	"context"
	"encoding/json"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/testlog"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Observe mode against a real kube-apiserver: a coordinator started with --fence-mode=observe sees a
// StatefulSet member's node die (agent and kubelet silent, BMC still on) and decides as it would in
// enforce mode — but the BMC stays on (read back with ipmitool), no out-of-service taint is applied,
// the pod and its VolumeAttachment stay, and what would have happened is recorded: an OBSERVED
// record (listed over the API as fencectl list --would does), its NodeFence object, the would
// release on the record, and the WouldFence and WouldRelease Events on the Node.
func TestObserveModeSwitchesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 4, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		FenceMode: engine.FenceModeObserve, Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim := env.Nodes[4]
	failed := env.Fail(victim)

	rec := waitRecord(ctx, t, env, victim.Name, 30*time.Second, func(f *coordv1.NodeFence) bool {
		return fencing.Observed(f) && f.WouldReleaseAt != nil
	})
	t.Logf("%s: would fence %.2fs and would release %.2fs after it died", victim.Name,
		rec.CreatedAt.AsTime().Sub(failed).Seconds(), rec.WouldReleaseAt.AsTime().Sub(failed).Seconds())
	if rec.FinishedAt == nil || len(rec.Operations) != 0 || rec.ConfirmedOffAt != nil || !rec.Automatic {
		t.Fatalf("the observed record ran or claims a power-off: %v", rec)
	}
	if v, err := env.NodeView(ctx, victim.Name); err != nil || !v.Observed || !v.WouldFence {
		t.Fatalf("%s: the coordinator's view says observed %v, would fence %v (%v)", victim.Name, v.GetObserved(), v.GetWouldFence(), err)
	}
	time.Sleep(2 * time.Second) // give a wrong power-off or release every chance to happen
	assertUntouched(ctx, t, env, victim)
	if recs := env.Fences(ctx, victim.Name); len(recs) != 1 || recs[0].Id != rec.Id {
		t.Fatalf("%s: want the observed record alone, got %v", victim.Name, recs)
	}

	// The API lists it under the OBSERVED status (fencectl list --would).
	conn, err := env.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	list, err := coordv1.NewFenceServiceClient(conn).ListFences(ctx, &coordv1.ListFencesRequest{Status: coordv1.FenceStatus_FENCE_STATUS_OBSERVED})
	if err != nil || len(list.Fences) != 1 || list.Fences[0].Id != rec.Id || list.Fences[0].WouldReleaseAt == nil {
		t.Fatalf("ListFences status=observed: %v %v", list, err)
	}
	fencectlListWould(ctx, t, env, rec)
	w, err := kube.New(env.Cluster.Config(), kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, st, err := w.GetFence(ctx, rec.Id)
		if err == nil && st.Status == "observed" && st.WouldReleaseAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeFence %s: %+v %v", rec.Id, st, err)
		}
	}
	waitEvents(ctx, t, env, victim.Name, "WouldFence", "WouldRelease")
	for _, n := range env.Nodes[:4] {
		if recs := env.Fences(ctx, n.Name); len(recs) != 0 {
			t.Fatalf("%s (healthy) has records: %v", n.Name, recs)
		}
	}
}

// The per-node annotation in an enforcing coordinator, flipped at run time: a node annotated
// nodefence.io/fence-mode=observe dies and is only observed (BMC on, pod kept); when the annotation
// goes, the node gets a fresh grace period and is then fenced by a new decision (a second record,
// not the observed one), powered off and released.
func TestObserveAnnotationAtRunTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 4, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim := env.Nodes[4]
	annotate(ctx, t, env, victim.Name, `{"metadata":{"annotations":{"nodefence.io/fence-mode":"observe"}}}`)
	time.Sleep(time.Second) // the witness hands the engine the annotated Node
	env.Fail(victim)
	observed := waitRecord(ctx, t, env, victim.Name, 30*time.Second, func(f *coordv1.NodeFence) bool {
		return fencing.Observed(f) && f.WouldReleaseAt != nil
	})
	time.Sleep(2 * time.Second)
	assertUntouched(ctx, t, env, victim)

	switched := time.Now()
	annotate(ctx, t, env, victim.Name, `{"metadata":{"annotations":{"nodefence.io/fence-mode":null}}}`)
	released, err := env.WaitReleased(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	recs := env.Fences(ctx, victim.Name)
	if len(recs) != 2 || recs[1].Id != observed.Id || fencing.Observed(recs[0]) || recs[0].ConfirmedOffAt == nil {
		t.Fatalf("%s: want a new, confirmed record above the observed one: %v", victim.Name, recs)
	}
	if d := recs[0].CreatedAt.AsTime().Sub(switched); d < env.Opts.Grace {
		t.Fatalf("the enforced fence came %s after the switch: within the fresh grace period %s", d, env.Opts.Grace)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, victim.BMC.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool after the switch: %q %v", p, err)
	}
	t.Logf("%s: released %.2fs after the annotation was removed", victim.Name, released.Sub(switched).Seconds())
}

// fencectlListWould runs the real fencectl, as the scenario's operator: list --would shows the
// would-fence record with when it would have fenced and released.
func fencectlListWould(ctx context.Context, t *testing.T, env *Env, rec *coordv1.NodeFence) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fencectl")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nodefence/nodefence/coordinator/cmd/fencectl").CombinedOutput(); err != nil {
		t.Fatalf("build fencectl: %v\n%s", err, out)
	}
	files, err := env.PKI.Files(identity.Operator, "scenario")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"list", "--would", "--coordinator", env.Coord.Addr()}, pki.Args("", files)...)
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	t.Logf("fencectl list --would:\n%s", out)
	for _, want := range []string{"WOULD FENCE", "WOULD RELEASE", rec.Id, "nothing above was switched"} {
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("fencectl list --would lacks %q (%v)", want, err)
		}
	}
}

// waitRecord polls the node's newest record until ok holds.
func waitRecord(ctx context.Context, t *testing.T, env *Env, node string, within time.Duration, ok func(*coordv1.NodeFence) bool) *coordv1.NodeFence {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if recs := env.Fences(ctx, node); len(recs) > 0 && ok(recs[0]) {
			return recs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no such record within %s: %v", node, within, env.Fences(ctx, node))
		}
	}
}

// assertUntouched checks that nothing was switched, tainted or deleted for the node.
func assertUntouched(ctx context.Context, t *testing.T, env *Env, n *Node) {
	t.Helper()
	if p, err := ipmisim.IpmitoolPower(ctx, n.BMC.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("%s: BMC power read back %q (%v), want on", n.Name, p, err)
	}
	if ok, err := env.HasOutOfServiceTaint(ctx, n); err != nil || ok {
		t.Fatalf("%s: out-of-service taint %v (%v)", n.Name, ok, err)
	}
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, n.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("%s: pod %s: %v", n.Name, n.Pod, err)
	}
	if _, err := env.Admin.StorageV1().VolumeAttachments().Get(ctx, n.VA, metav1.GetOptions{}); err != nil {
		t.Fatalf("%s: VolumeAttachment %s: %v", n.Name, n.VA, err)
	}
}

// waitEvents waits for an Event of each reason on the Node.
func waitEvents(ctx context.Context, t *testing.T, env *Env, node string, reasons ...string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		evs, err := env.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node})
		seen := map[string]string{}
		if err == nil {
			for _, ev := range evs.Items {
				seen[ev.Reason] = ev.Message
			}
		}
		missing := ""
		for _, r := range reasons {
			if _, ok := seen[r]; !ok {
				missing = r
			}
		}
		if missing == "" {
			for _, r := range reasons {
				t.Logf("Event %s on %s: %s", r, node, seen[r])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on Node %s (%v): %v", missing, node, err, seen)
		}
	}
}

// annotate merge-patches the Node as the cluster's administrator.
func annotate(ctx context.Context, t *testing.T, env *Env, node, patch string) {
	t.Helper()
	if !json.Valid([]byte(patch)) {
		t.Fatalf("patch %s", patch)
	}
	if _, err := env.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

package kubescenario

import (
	"context"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A fence that switches off the wrong machine, in Kubernetes mode: the victim's agent keeps
// reporting while the driver confirms "its" BMC off (the BMC is not the machine the agent runs on).
// The coordinator raises the alarm — the record's wrong_machine_at and a Warning Event on the
// Node — and releases nothing: no out-of-service taint, the StatefulSet pod stays.
func TestWrongMachineReleasesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 3, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		Log: slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim := env.Nodes[3]
	cc, err := dial.New(env.Coord.Addr(), tlsfiles.Files{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fc := coordv1.NewFenceServiceClient(cc)
	f, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: victim.Name, Reason: "wrong machine test"})
	if err != nil {
		t.Fatal(err)
	}
	var rec *coordv1.NodeFence
	for deadline := time.Now().Add(30 * time.Second); rec == nil; time.Sleep(100 * time.Millisecond) {
		g, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: f.Fence.Id})
		if err == nil && g.Fence.WrongMachineAt != nil {
			rec = g.Fence
		}
		if time.Now().After(deadline) {
			t.Fatalf("no wrong-machine alarm on %s: %v %v", f.Fence.Id, g, err)
		}
	}
	if p, err := ipmisim.IpmitoolPower(ctx, victim.BMC.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool: %q %v; want off (the driver did switch its BMC off)", p, err)
	}
	var found bool
	for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		evs, err := env.Admin.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			found = found || (ev.Reason == "FenceHitWrongMachine" && ev.InvolvedObject.Name == victim.Name && ev.Type == "Warning")
		}
	}
	if !found {
		t.Fatal("no FenceHitWrongMachine Warning Event on the Node")
	}
	time.Sleep(3 * time.Second) // past the proof window: nothing may be released
	if ok, err := env.HasOutOfServiceTaint(ctx, victim); err != nil || ok {
		t.Fatalf("out-of-service taint on %s: %v %v; want none", victim.Name, ok, err)
	}
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, victim.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("pod %s of %s: %v; want it kept", victim.Pod, victim.Name, err)
	}
}

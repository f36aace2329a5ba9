package kubepods

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodefence/nodefence/node-agent/cri"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/testbed/containerdtest"
)

// TestSourceRanksByRealWritableLayers: the node's pods from the apiserver, their containers real
// ones in containerd (created through CRI as kubelet does, labelled with the pods' uids) that write
// 5 MiB and 1 MiB into their writable layers. The Source, reading the layers through the CRI
// client as the agent wires it, gives each pod its own writable use, and ranking for nodefs
// pressure takes the pod that wrote most, though its name sorts last.
func TestSourceRanksByRealWritableLayers(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node, mib = "node-writable", 1 << 20
	small := createPod(ctx, t, ns, podSpec{name: "a-small", node: node})
	big := createPod(ctx, t, ns, podSpec{name: "z-big", node: node})

	ctd := containerdtest.Start(t)
	ctd.ImportBusybox(t, "nodefence.test/pause:none", "/bin/busybox", "sleep", "100000")
	ctd.ImportBusybox(t, "nodefence.test/busybox:1", "/bin/sh")
	rc, err := cri.Dial(ctd.Endpoint(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rt := runtimeapi.NewRuntimeServiceClient(dialCRI(t, ctd.Socket))
	for { // the CRI plugin starts after the socket
		if _, _, err = rc.ImageFS(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before containerd stops: no shim outlives the test
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r, err := rt.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, s := range r.Items {
				_, _ = rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
				_, _ = rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id})
			}
		}
	})
	for _, w := range []struct {
		name, uid, count string
	}{{small.Name, string(small.UID), "1"}, {big.Name, string(big.UID), "5"}} {
		sbCfg := &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: w.name, Uid: w.uid, Namespace: ns},
			Labels:   map[string]string{cri.PodUIDLabel: w.uid},
			Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
			LogDirectory: t.TempDir(),
		}
		sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
		if err != nil {
			t.Fatal(err)
		}
		ct, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sbCfg,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
				Image:    &runtimeapi.ImageSpec{Image: "nodefence.test/busybox:1"},
				Command: []string{"/bin/busybox", "sh", "-c",
					"/bin/busybox dd if=/dev/zero of=/fill bs=1048576 count=" + w.count + " && /bin/busybox sync && exec /bin/busybox sleep 100000"},
				Labels:  map[string]string{cri.PodUIDLabel: w.uid, "io.kubernetes.container.name": "app"},
				LogPath: "app.log",
			}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ct.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}

	// The adapter the node-agent binary sets.
	src := runSource(t, node, nil, WithWritable(func(ctx context.Context) (map[string][2]int64, error) {
		w, err := rc.Writable(ctx)
		out := make(map[string][2]int64, len(w))
		for uid, u := range w {
			out[uid] = [2]int64{u.Bytes, u.Inodes}
		}
		return out, err
	}))
	var pods []eviction.Pod
	byName := map[string]eviction.Pod{}
	deadline := time.Now().Add(time.Minute) // containerd refreshes layer usage every 10 s
	for {
		if pods, err = src.PodsWithDisk(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			byName[p.Name] = p
		}
		if byName["z-big"].Disk.Writable >= 5*mib && byName["a-small"].Disk.Writable >= mib {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writable layers never reached the pods: %+v", pods)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if w := byName["a-small"].Disk.Writable; w > 2*mib {
		t.Errorf("a-small's writable layer %d: it wrote 1 MiB (another pod's use counted?)", w)
	}
	c, ok := eviction.Next(eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalNodeFSAvailable}, Need: 1}, eviction.LayoutSingle, pods, 0)
	if !ok || c.Name != "z-big" {
		t.Errorf("next pod for nodefs pressure: %+v (%v), want z-big", c, ok)
	}
}

// dialCRI connects to a CRI socket for the test's own calls (creating pods as kubelet would).
func dialCRI(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

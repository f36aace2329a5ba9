package cri

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/testbed/containerdtest"
)

// Images of the real-container tests. The sandbox image's name is containerdtest's sandbox_image.
const (
	pauseRef   = "nodefence.test/pause:none"
	busyboxRef = "nodefence.test/busybox:1"
	unusedRef  = "nodefence.test/unused:1"
)

// pods is a real containerd with pods created through CRI, as kubelet creates them.
type pods struct {
	t   *testing.T
	ctx context.Context
	c   *Client
	rt  runtimeapi.RuntimeServiceClient
}

func startPods(t *testing.T) *pods {
	t.Helper()
	ctd := containerdtest.Start(t)
	ctd.ImportBusybox(t, pauseRef, "/bin/busybox", "sleep", "100000")
	ctd.ImportBusybox(t, busyboxRef, "/bin/sh")
	ctd.ImportImage(t, unusedRef, 64<<10)
	c, err := Dial(ctd.Endpoint(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	p := &pods{t: t, ctx: ctx, c: c, rt: c.runtime}
	t.Cleanup(func() {
		// Before containerd stops (cleanups run last first): no shim may outlive the test.
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if r, err := p.rt.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, s := range r.Items {
				_, _ = p.rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
				_, _ = p.rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id})
			}
		}
		c.Close()
		cancel()
	})
	for { // the CRI plugin starts after the socket
		if _, _, err = c.ImageFS(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sandbox runs a pod sandbox in the host's network (no CNI), as kubelet labels it.
func (p *pods) sandbox(name, uid string, attempt uint32) (string, *runtimeapi.PodSandboxConfig) {
	p.t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "default", Attempt: attempt},
		Labels:   map[string]string{PodUIDLabel: uid},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		LogDirectory: p.t.TempDir(),
	}
	r, err := p.rt.RunPodSandbox(p.ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		p.t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	return r.PodSandboxId, cfg
}

// container creates a busybox container running script in the sandbox, and starts it unless
// start is false.
func (p *pods) container(sb string, sbCfg *runtimeapi.PodSandboxConfig, name string, attempt uint32, script string, start bool) string {
	p.t.Helper()
	r, err := p.rt.CreateContainer(p.ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb, SandboxConfig: sbCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
			Image:    &runtimeapi.ImageSpec{Image: busyboxRef},
			Command:  []string{"/bin/busybox", "sh", "-c", script},
			Labels:   map[string]string{PodUIDLabel: sbCfg.Metadata.Uid, "io.kubernetes.container.name": name},
			LogPath:  name + "-" + string(rune('0'+attempt)) + ".log",
		}})
	if err != nil {
		p.t.Fatalf("CreateContainer %s: %v", name, err)
	}
	if start {
		if _, err := p.rt.StartContainer(p.ctx, &runtimeapi.StartContainerRequest{ContainerId: r.ContainerId}); err != nil {
			p.t.Fatalf("StartContainer %s: %v", name, err)
		}
	}
	return r.ContainerId
}

// waitState waits until container id is in state.
func (p *pods) waitState(id string, state runtimeapi.ContainerState) {
	p.t.Helper()
	for {
		r, err := p.rt.ContainerStatus(p.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			p.t.Fatalf("ContainerStatus %s: %v", id, err)
		}
		if r.Status.State == state {
			return
		}
		if p.ctx.Err() != nil {
			p.t.Fatalf("container %s stays %v, want %v", id, r.Status.State, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *pods) containerIDs() []string {
	p.t.Helper()
	r, err := p.rt.ListContainers(p.ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		p.t.Fatal(err)
	}
	var ids []string
	for _, c := range r.Containers {
		ids = append(ids, c.Id)
	}
	slices.Sort(ids)
	return ids
}

func (p *pods) sandboxIDs() []string {
	p.t.Helper()
	r, err := p.rt.ListPodSandbox(p.ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		p.t.Fatal(err)
	}
	var ids []string
	for _, s := range r.Items {
		ids = append(ids, s.Id)
	}
	slices.Sort(ids)
	return ids
}

func (p *pods) imageTags() []string {
	p.t.Helper()
	r, err := p.c.images.ListImages(p.ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		p.t.Fatal(err)
	}
	var tags []string
	for _, im := range r.Images {
		tags = append(tags, im.RepoTags...)
	}
	slices.Sort(tags)
	return tags
}

func without(ids []string, gone ...string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(gone, id) })
}

// TestWritableLayersRankPods: two pods whose containers write 6 MiB and 1 MiB into their writable
// layers. The usage the agent reads (Writable) is what containerd reports for each container,
// covers what was written, and ranks the pods for nodefs pressure as kubelet does: by disk use,
// so the pod whose name sorts last but that wrote most goes first.
func TestWritableLayersRankPods(t *testing.T) {
	p := startPods(t)
	const mib = 1 << 20
	sbBig, cfgBig := p.sandbox("z-big", "uid-big", 0)
	sbSmall, cfgSmall := p.sandbox("a-small", "uid-small", 0)
	fill := func(n string) string {
		return "/bin/busybox dd if=/dev/zero of=/fill bs=1048576 count=" + n + " && /bin/busybox sync && exec /bin/busybox sleep 100000"
	}
	big := []string{p.container(sbBig, cfgBig, "writer", 0, fill("4"), true), p.container(sbBig, cfgBig, "helper", 0, fill("2"), true)}
	small := []string{p.container(sbSmall, cfgSmall, "writer", 0, fill("1"), true)}

	// containerd's CRI refreshes snapshot usage in the background (every 10 s in 1.6): wait until
	// every container's writes are counted.
	var w map[string]Usage
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		if w, err = p.c.Writable(p.ctx); err != nil {
			t.Fatal(err)
		}
		if w["uid-big"].Bytes >= 6*mib && w["uid-small"].Bytes >= 1*mib {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writable layers never showed the writes: %+v", w)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(w) != 2 {
		t.Errorf("Writable has %d pods, want 2: %+v", len(w), w)
	}
	// What containerd reports container by container, summed per pod.
	sum := func(ids []string) Usage {
		var u Usage
		for _, id := range ids {
			r, err := p.rt.ContainerStats(p.ctx, &runtimeapi.ContainerStatsRequest{ContainerId: id})
			if err != nil {
				t.Fatal(err)
			}
			u.Bytes += int64(r.Stats.WritableLayer.UsedBytes.Value)
			u.Inodes += int64(r.Stats.WritableLayer.InodesUsed.Value)
		}
		return u
	}
	if got, want := w["uid-big"], sum(big); got != want {
		t.Errorf("pod big: agent reads %+v, containerd reports %+v", got, want)
	}
	if got, want := w["uid-small"], sum(small); got != want {
		t.Errorf("pod small: agent reads %+v, containerd reports %+v", got, want)
	}
	for uid, written := range map[string]int64{"uid-big": 6 * mib, "uid-small": mib} {
		// The files written, plus at most a little metadata (busybox writes nothing else).
		if u := w[uid]; u.Bytes < written || u.Bytes > written+mib || u.Inodes < 1 {
			t.Errorf("pod %s: writable layer %+v after writing %d bytes", uid, u, written)
		}
	}

	var list []eviction.Pod
	for _, x := range []struct{ name, uid string }{{"a-small", "uid-small"}, {"z-big", "uid-big"}} {
		u := w[x.uid]
		list = append(list, eviction.Pod{Namespace: "default", Name: x.name, UID: x.uid, QoS: eviction.BestEffort,
			Disk: eviction.DiskUsage{Writable: u.Bytes}, DiskInodes: eviction.DiskUsage{Writable: u.Inodes}})
	}
	for _, sig := range []string{eviction.SignalNodeFSAvailable, eviction.SignalNodeFSInodesFree} {
		r := eviction.Reclaim{Threshold: eviction.Threshold{Signal: sig}, Need: 1}
		c, ok := eviction.Next(r, eviction.LayoutSingle, list, 0)
		if !ok || c.UID != "uid-big" {
			t.Errorf("%s: next pod %+v (%v), want z-big", sig, c, ok)
		}
	}
	// With a dedicated imagefs holding the writable layers (split disk), nodefs ranking does not count them: the
	// names decide, and imagefs ranking still takes z-big.
	if c, _ := eviction.Next(eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalNodeFSAvailable}, Need: 1},
		eviction.LayoutSplitDisk, list, 0); c.UID != "uid-small" {
		t.Errorf("split layout, nodefs: next pod %+v, want a-small", c)
	}
	if c, _ := eviction.Next(eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalImageFSAvailable}, Need: 1},
		eviction.LayoutSplitDisk, list, 0); c.UID != "uid-big" {
		t.Errorf("split layout, imagefs: next pod %+v, want z-big", c)
	}
}

// TestReclaimAsKubelet: the node-level reclaim against real containers, checked against kubelet's
// container and image GC (default policy): per pod and container name, every container that is
// not running goes but the newest (created-only ones too); a gone pod loses all of its dead
// containers, its sandbox and its log directory; a pod's older dead sandbox goes; running containers and ready
// sandboxes stay. Images: one no container uses goes once it is ImageMinAge old, the one dead and
// running containers use stays.
func TestReclaimAsKubelet(t *testing.T) {
	p := startPods(t)
	// Pod keep (present): an older sandbox, stopped and empty, then its current one.
	oldSb, _ := p.sandbox("keep", "uid-keep", 0)
	if _, err := p.rt.StopPodSandbox(p.ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: oldSb}); err != nil {
		t.Fatal(err)
	}
	sb, cfg := p.sandbox("keep", "uid-keep", 1)
	run := p.container(sb, cfg, "server", 0, "exec /bin/busybox sleep 100000", true)
	job0 := p.container(sb, cfg, "job", 0, "exit 0", true)
	p.waitState(job0, runtimeapi.ContainerState_CONTAINER_EXITED)
	job1 := p.container(sb, cfg, "job", 1, "exit 1", true)
	p.waitState(job1, runtimeapi.ContainerState_CONTAINER_EXITED)
	idle0 := p.container(sb, cfg, "idle", 0, "true", false)
	p.container(sb, cfg, "idle", 1, "true", false)
	p.waitState(run, runtimeapi.ContainerState_CONTAINER_RUNNING)
	// Pod gone (deleted from the node): one dead container in a stopped sandbox.
	goneSb, goneCfg := p.sandbox("gone", "uid-gone", 0)
	gone0 := p.container(goneSb, goneCfg, "main", 0, "exit 0", true)
	p.waitState(gone0, runtimeapi.ContainerState_CONTAINER_EXITED)
	if _, err := p.rt.StopPodSandbox(p.ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: goneSb}); err != nil {
		t.Fatal(err)
	}

	p.c.PodGone = func(uid string) bool { return uid == "uid-gone" }
	// Pod log directories, kubelet's <namespace>_<name>_<uid>: the gone pod's go.
	p.c.PodLogDir = t.TempDir()
	p.c.PodRemoved = func(uid string) bool { return uid == "uid-gone" }
	for _, d := range []string{"default_keep_uid-keep", "default_gone_uid-gone"} {
		if err := os.MkdirAll(filepath.Join(p.c.PodLogDir, d, "main"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.c.PodLogDir, d, "main", "0.log"), []byte("log\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	containersBefore, sandboxesBefore := p.containerIDs(), p.sandboxIDs()
	got, err := p.c.Reclaim(p.ctx, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if dirs, _ := os.ReadDir(p.c.PodLogDir); len(dirs) != 1 || dirs[0].Name() != "default_keep_uid-keep" {
		t.Errorf("pod log directories after reclaim: %v, want only the present pod's", dirs)
	}
	if want := (Reclaimed{Containers: 3, Sandboxes: 2, LogDirs: 1}); got != want {
		t.Errorf("Reclaim(containers) = %+v, want %+v", got, want)
	}
	if ids, want := p.containerIDs(), without(containersBefore, job0, idle0, gone0); !slices.Equal(ids, want) {
		t.Errorf("containers after reclaim %v, want %v (removed: job0 %s, idle0 %s, gone0 %s)", ids, want, job0, idle0, gone0)
	}
	if ids, want := p.sandboxIDs(), without(sandboxesBefore, oldSb, goneSb); !slices.Equal(ids, want) {
		t.Errorf("sandboxes after reclaim %v, want %v (removed: old %s, gone %s)", ids, want, oldSb, goneSb)
	}

	// Images: the unused one was first seen just now, so it stays (kubelet's minimum GC age) ...
	start := time.Now()
	p.c.now = func() time.Time { return start }
	tagsBefore := p.imageTags()
	if !slices.Contains(tagsBefore, unusedRef) || !slices.Contains(tagsBefore, busyboxRef) {
		t.Fatalf("images before reclaim: %v", tagsBefore)
	}
	if got, err := p.c.Reclaim(p.ctx, false, true); err != nil || got.Images != 0 {
		t.Errorf("Reclaim(images) on fresh images = %+v, %v; want none removed", got, err)
	}
	// ... until ImageMinAge has passed: then it goes, and the images containers use stay.
	p.c.now = func() time.Time { return start.Add(DefaultImageMinAge) }
	got, err = p.c.Reclaim(p.ctx, false, true)
	if err != nil {
		t.Fatal(err)
	}
	tags := p.imageTags()
	if slices.Contains(tags, unusedRef) || !slices.Contains(tags, busyboxRef) {
		t.Errorf("images after reclaim %v (removed %d): want %s gone, %s kept", tags, got.Images, unusedRef, busyboxRef)
	}
	// No container uses the sandbox image; containerd 1.6 does not pin it, so kubelet's GC
	// removes it too, as here.
	t.Logf("images after reclaim: %v (removed %d)", tags, got.Images)
}

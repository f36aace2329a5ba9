package kubepods

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// An evicted pod counts as cleaned up, as in kubelet's podResourcesAreReclaimed, only once its
// object is gone or its containers are terminated AND none of its volumes is still set up: the
// pages of a memory-backed emptyDir stay charged to the pods' cgroup until the kubelet tears it
// down, and evaluating before that evicts a second pod for the same pressure.
func TestCleanedUpWaitsForVolumeTeardown(t *testing.T) {
	root := t.TempDir()
	disk := &Disk{KubeletRoot: root}
	src := &Source{store: newPodStore(), disk: disk}
	k := &Killer{src: src}
	c := eviction.Candidate{Namespace: "default", Name: "hog", UID: "uid-1"}
	ctx := context.Background()

	running := &Pod{}
	running.Namespace, running.Name, running.UID = "default", "hog", "uid-1"
	running.Status.ContainerStatuses = []ContainerStatus{{Name: "hog", State: ContainerState{Running: &struct{}{}}}}
	src.store.pods[podKey("default", "hog")] = running
	if k.CleanedUp(ctx, c) {
		t.Fatal("cleaned up while its container runs")
	}

	delete(src.store.pods, podKey("default", "hog"))
	vol := filepath.Join(root, "pods", "uid-1", "volumes", "kubernetes.io~empty-dir", "fill")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if k.CleanedUp(ctx, c) {
		t.Fatal("cleaned up while its emptyDir is still set up")
	}
	if err := os.Remove(vol); err != nil {
		t.Fatal(err)
	}
	if !k.CleanedUp(ctx, c) {
		t.Fatal("not cleaned up after the object is gone and its volumes are torn down")
	}
	if err := os.RemoveAll(filepath.Join(root, "pods")); err != nil {
		t.Fatal(err)
	}
	if !k.CleanedUp(ctx, c) {
		t.Fatal("not cleaned up without a pod directory")
	}
}

package cri

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodefence/nodefence/testbed/containerdtest"
)

// TestAgainstContainerd: a real containerd's CRI: the image filesystem is under its root, no
// container has a writable layer yet, and Reclaim removes an image no container uses (with no
// minimum image age).
func TestAgainstContainerd(t *testing.T) {
	ctd := containerdtest.Start(t)
	ctd.ImportImage(t, "nodefence.test/unused:1", 64<<10)
	c, err := Dial(ctd.Endpoint(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var image FS
	for {
		if image, _, err = c.ImageFS(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the CRI plugin starts after the socket
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(image.Mountpoint, filepath.Clean(ctd.Root)) {
		t.Errorf("image filesystem %q; want below containerd's root %s", image.Mountpoint, ctd.Root)
	}
	w, err := c.Writable(ctx)
	if err != nil || len(w) != 0 {
		t.Errorf("Writable = %v, %v; want no pods", w, err)
	}
	list := func() []string {
		r, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var tags []string
		for _, im := range r.Images {
			tags = append(tags, im.RepoTags...)
		}
		return tags
	}
	if tags := list(); len(tags) != 1 || tags[0] != "nodefence.test/unused:1" {
		t.Fatalf("images before reclaim: %v", tags)
	}
	c.ImageMinAge = 0 // kubelet's --image-minimum-gc-age=0: an image may go as soon as it is seen
	got, err := c.Reclaim(ctx, true, true)
	if err != nil || got.Images != 1 || got.Containers != 0 {
		t.Errorf("Reclaim = %+v, %v; want one image removed", got, err)
	}
	if tags := list(); len(tags) != 0 {
		t.Errorf("images after reclaim: %v", tags)
	}
	if _, err := Dial("tcp://127.0.0.1:1", nil); err == nil {
		t.Error("Dial accepted a TCP endpoint")
	}
}

// Package cri is the node agent's client of the container runtime (CRI, k8s.io/cri-api, e.g.
// containerd's socket), for the facts kubelet's eviction manager gets from it:
//
//   - ImageFS: where the runtime keeps images and the containers' writable layers (kubelet's
//     imagefs and containerfs discovery, ImageFsInfo);
//   - Writable: each pod's writable-layer use (ListContainerStats), for disk ranking;
//   - Reclaim: kubelet's node-level reclaim before evicting for a filesystem signal: dead
//     containers removed (containerGC.DeleteAllUnusedContainers), then images no container uses
//     (imageGC.DeleteUnusedImages).
package cri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultEndpoint is containerd's CRI socket, kubelet's usual --container-runtime-endpoint.
const DefaultEndpoint = "unix:///run/containerd/containerd.sock"

// PodUIDLabel is the label the kubelet puts on every container with its pod's uid.
const PodUIDLabel = "io.kubernetes.pod.uid"

// callTimeout bounds each CRI call (kubelet's default runtime request timeout is 2m; these calls
// are reads and removals that a healthy runtime answers in milliseconds).
const callTimeout = 30 * time.Second

// Client talks to one runtime. Create it with Dial; Close it when done.
type Client struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
	log     *slog.Logger
}

// Dial connects to a CRI endpoint ("unix:///path" or a bare socket path). It does not wait for the
// runtime: the first call fails if it is not there.
func Dial(endpoint string, log *slog.Logger) (*Client, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok && strings.Contains(endpoint, "://") {
		return nil, fmt.Errorf("CRI endpoint %q: only unix sockets are supported", endpoint)
	}
	if path == "" {
		return nil, errors.New("CRI endpoint: empty socket path")
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %q: %w", endpoint, err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Client{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), images: runtimeapi.NewImageServiceClient(conn),
		log: log.With("component", "cri")}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// FS is one filesystem the runtime reports: its mount point and what the runtime's own data takes.
type FS struct {
	Mountpoint string
	UsedBytes  uint64
	InodesUsed uint64
}

// ImageFS returns the runtime's image filesystem and, when it keeps writable layers elsewhere, its
// container filesystem (empty otherwise), as kubelet's HasDedicatedImageFs and
// HasDedicatedContainerFs read them.
func (c *Client) ImageFS(ctx context.Context) (image FS, container FS, err error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := c.images.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		return FS{}, FS{}, fmt.Errorf("ImageFsInfo: %w", err)
	}
	if len(r.GetImageFilesystems()) == 0 {
		return FS{}, FS{}, errors.New("ImageFsInfo: the runtime reports no image filesystem")
	}
	conv := func(u *runtimeapi.FilesystemUsage) FS {
		return FS{Mountpoint: u.GetFsId().GetMountpoint(), UsedBytes: u.GetUsedBytes().GetValue(), InodesUsed: u.GetInodesUsed().GetValue()}
	}
	image = conv(r.GetImageFilesystems()[0])
	if cf := r.GetContainerFilesystems(); len(cf) > 0 {
		container = conv(cf[0])
	}
	return image, container, nil
}

// Usage is a pod's writable-layer use.
type Usage struct {
	Bytes, Inodes int64
}

// Writable returns each pod's writable-layer use (the sum over its containers), keyed by pod uid,
// from ListContainerStats.
func (c *Client) Writable(ctx context.Context) (map[string]Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := c.runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListContainerStats: %w", err)
	}
	out := map[string]Usage{}
	for _, s := range r.GetStats() {
		uid := s.GetAttributes().GetLabels()[PodUIDLabel]
		if uid == "" {
			continue
		}
		u := out[uid]
		u.Bytes += int64(min(s.GetWritableLayer().GetUsedBytes().GetValue(), 1<<62))
		u.Inodes += int64(min(s.GetWritableLayer().GetInodesUsed().GetValue(), 1<<62))
		out[uid] = u
	}
	return out, nil
}

// Reclaimed says what a Reclaim removed.
type Reclaimed struct {
	Containers, Images int
}

// Reclaim frees what kubelet's eviction manager frees before evicting pods for a filesystem
// signal, as its reclaim functions for the filesystem are given: with containers, the dead
// (exited) containers except the newest of each pod's container name (kubelet's MaxPerPodContainer
// of 1); with images, the images no container (of any state) uses. Errors of single removals are
// logged and the rest goes on.
func (c *Client) Reclaim(ctx context.Context, containers, images bool) (Reclaimed, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	var out Reclaimed
	if containers {
		n, err := c.removeDeadContainers(ctx)
		out.Containers = n
		if err != nil {
			return out, err
		}
	}
	if images {
		n, err := c.removeUnusedImages(ctx)
		out.Images = n
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func (c *Client) removeDeadContainers(ctx context.Context) (int, error) {
	r, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListContainers: %w", err)
	}
	var dead []*runtimeapi.Container
	for _, ct := range r.GetContainers() {
		if ct.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			dead = append(dead, ct)
		}
	}
	// Newest first within each pod container; the first of each stays.
	slices.SortStableFunc(dead, func(a, b *runtimeapi.Container) int { return -cmpInt64(a.GetCreatedAt(), b.GetCreatedAt()) })
	kept := map[string]bool{}
	removed := 0
	for _, ct := range dead {
		key := ct.GetLabels()[PodUIDLabel] + "/" + ct.GetMetadata().GetName()
		if !kept[key] && ct.GetLabels()[PodUIDLabel] != "" {
			kept[key] = true
			continue
		}
		if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ct.GetId()}); err != nil {
			c.log.Warn("removing a dead container failed", "container", ct.GetId(), "error", err)
			continue
		}
		removed++
	}
	return removed, nil
}

func (c *Client) removeUnusedImages(ctx context.Context) (int, error) {
	cs, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListContainers: %w", err)
	}
	used := map[string]bool{}
	for _, ct := range cs.GetContainers() {
		used[ct.GetImageRef()] = true
		used[ct.GetImage().GetImage()] = true
	}
	is, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListImages: %w", err)
	}
	removed := 0
	for _, im := range is.GetImages() {
		if im.GetPinned() || used[im.GetId()] || slices.ContainsFunc(im.GetRepoTags(), func(t string) bool { return used[t] }) ||
			slices.ContainsFunc(im.GetRepoDigests(), func(d string) bool { return used[d] }) {
			continue
		}
		if _, err := c.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: im.GetId()}}); err != nil {
			c.log.Warn("removing an unused image failed", "image", im.GetId(), "error", err)
			continue
		}
		removed++
	}
	return removed, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

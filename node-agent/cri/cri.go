// Package cri is the node agent's client of the container runtime (CRI, k8s.io/cri-api, e.g.
// containerd's socket), for the facts kubelet's eviction manager gets from it:
//
//   - ImageFS: where the runtime keeps images and the containers' writable layers (kubelet's
//     imagefs and containerfs discovery, ImageFsInfo);
//   - Writable: each pod's writable-layer use (ListContainerStats), for disk ranking;
//   - Reclaim: kubelet's node-level reclaim before evicting for a filesystem signal: dead
//     containers and sandboxes removed (containerGC.DeleteAllUnusedContainers), then images no
//     container uses (imageGC.DeleteUnusedImages).
package cri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// Kubelet's garbage collection defaults.
const (
	// DefaultImageMinAge is kubelet's --image-minimum-gc-age default.
	DefaultImageMinAge = 2 * time.Minute
	// DetectPeriod is how often kubelet's image GC loop looks at the images (ImageGCPeriod).
	DetectPeriod = 5 * time.Minute
	// maxPerPodContainer is kubelet's default MaxPerPodContainer: dead containers kept per pod and
	// container name.
	maxPerPodContainer = 1
)

// Client talks to one runtime. Create it with Dial; Close it when done.
type Client struct {
	// ImageMinAge is kubelet's --image-minimum-gc-age: an image first seen less than this long ago
	// is never removed. Dial sets DefaultImageMinAge.
	ImageMinAge time.Duration
	// PodGone, when set, reports whether a pod (by uid) no longer needs its containers: deleted
	// from the node, or terminated (kubelet's ShouldPodContentBeRemoved and, as the eviction
	// manager asks, ShouldPodRuntimeBeRemoved). Such a pod's dead containers and sandboxes all go.
	// Nil counts every pod as present: one dead container per name is kept.
	PodGone func(uid string) bool
	// PodLogDir is the kubelet's pod log directory (/var/log/pods); empty leaves pod logs alone.
	// With PodRemoved set, the containers' reclaim also removes the log directories of pods
	// kubelet would empty (kubelet's evictPodLogsDirectories).
	PodLogDir string
	// PodRemoved reports whether a pod's content (its logs) may go: the pod is no longer on the
	// node, or it was evicted (kubelet's ShouldPodContentBeRemoved). Nil keeps every log.
	PodRemoved func(uid string) bool

	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
	log     *slog.Logger
	now     func() time.Time

	mu           sync.Mutex
	imageRecords map[string]*imageRecord // by image id
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
	return &Client{ImageMinAge: DefaultImageMinAge, conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn),
		images: runtimeapi.NewImageServiceClient(conn), log: log.With("component", "cri"), now: time.Now,
		imageRecords: map[string]*imageRecord{}}, nil
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
	Containers, Sandboxes, LogDirs, Images int
}

func (r Reclaimed) String() string {
	return fmt.Sprintf("%d containers, %d sandboxes, %d pod log directories, %d images", r.Containers, r.Sandboxes, r.LogDirs, r.Images)
}

// Reclaim frees what kubelet's eviction manager frees before evicting pods for a filesystem
// signal (reclaimNodeLevelResources), as its reclaim functions for the filesystem are given:
//
//   - containers: kubelet's DeleteAllUnusedContainers with its default policy (no minimum age, one
//     dead container kept per pod and container name, no total cap): every container that is not
//     running, grouped by pod uid and container name, loses all but its newest - or all of them
//     when the pod is gone (PodGone); then the sandboxes that are not ready and hold no container,
//     all but each pod's newest (all of them when the pod is gone); then the log directories of
//     pods whose content may go (PodRemoved, PodLogDir);
//   - images: kubelet's DeleteUnusedImages: every image no container (of any state) uses, that is
//     not pinned and was first seen at least ImageMinAge ago, oldest use first.
//
// Errors of single removals are logged and the rest goes on.
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
		if out.Sandboxes, err = c.removeDeadSandboxes(ctx); err != nil {
			return out, err
		}
		out.LogDirs = c.removePodLogDirs()
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

func (c *Client) gone(uid string) bool { return c.PodGone != nil && c.PodGone(uid) }

// removeDeadContainers is kubelet's evictContainers with the default GC policy and evictNonDeletedPods.
func (c *Client) removeDeadContainers(ctx context.Context) (int, error) {
	r, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListContainers: %w", err)
	}
	type unit struct{ uid, name string }
	units := map[unit][]*runtimeapi.Container{}
	for _, ct := range r.GetContainers() {
		if ct.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		k := unit{ct.GetLabels()[PodUIDLabel], ct.GetMetadata().GetName()}
		units[k] = append(units[k], ct)
	}
	removed := 0
	for k, cts := range units {
		keep := maxPerPodContainer
		if c.gone(k.uid) {
			keep = 0
		}
		if len(cts) <= keep {
			continue
		}
		// Newest first; the oldest go.
		slices.SortStableFunc(cts, func(a, b *runtimeapi.Container) int { return -cmpInt64(a.GetCreatedAt(), b.GetCreatedAt()) })
		for _, ct := range slices.Backward(cts[keep:]) {
			if ct.GetState() == runtimeapi.ContainerState_CONTAINER_UNKNOWN {
				// kubelet stops a container in an unknown state before removing it.
				if _, err := c.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ct.GetId()}); err != nil {
					c.log.Warn("stopping a container in an unknown state failed", "container", ct.GetId(), "error", err)
					continue
				}
			}
			if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ct.GetId()}); err != nil {
				c.log.Warn("removing a dead container failed", "container", ct.GetId(), "error", err)
				continue
			}
			removed++
		}
	}
	return removed, nil
}

// removeDeadSandboxes is kubelet's evictSandboxes: a sandbox that is not ready and holds no
// container goes, unless it is its pod's newest and the pod is still there.
func (c *Client) removeDeadSandboxes(ctx context.Context) (int, error) {
	cs, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListContainers: %w", err)
	}
	holding := map[string]bool{}
	for _, ct := range cs.GetContainers() {
		holding[ct.GetPodSandboxId()] = true
	}
	ss, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListPodSandbox: %w", err)
	}
	byPod := map[string][]*runtimeapi.PodSandbox{}
	for _, s := range ss.GetItems() {
		byPod[s.GetMetadata().GetUid()] = append(byPod[s.GetMetadata().GetUid()], s)
	}
	removed := 0
	for uid, list := range byPod {
		keep := 1
		if c.gone(uid) {
			keep = 0
		}
		if len(list) <= keep {
			continue
		}
		slices.SortStableFunc(list, func(a, b *runtimeapi.PodSandbox) int { return -cmpInt64(a.GetCreatedAt(), b.GetCreatedAt()) })
		for _, s := range slices.Backward(list[keep:]) {
			if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY || holding[s.GetId()] {
				continue
			}
			if _, err := c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
				c.log.Warn("stopping a dead sandbox failed", "sandbox", s.GetId(), "error", err)
				continue
			}
			if _, err := c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
				c.log.Warn("removing a dead sandbox failed", "sandbox", s.GetId(), "error", err)
				continue
			}
			removed++
		}
	}
	return removed, nil
}

// removePodLogDirs is the first half of kubelet's evictPodLogsDirectories: every directory of
// PodLogDir ("<namespace>_<name>_<uid>") whose pod's content may go is removed. (The second half,
// dangling /var/log/containers symlinks, is not done: kubelet's own GC loop still does it.)
func (c *Client) removePodLogDirs() int {
	if c.PodLogDir == "" || c.PodRemoved == nil {
		return 0
	}
	entries, err := os.ReadDir(c.PodLogDir)
	if err != nil {
		c.log.Warn("reading the pod log directory failed", "dir", c.PodLogDir, "error", err)
		return 0
	}
	removed := 0
	for _, e := range entries {
		name := e.Name()
		uid := name[strings.LastIndexByte(name, '_')+1:]
		if !c.PodRemoved(uid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.PodLogDir, name)); err != nil {
			c.log.Warn("removing a pod log directory failed", "dir", name, "error", err)
			continue
		}
		removed++
	}
	return removed
}

// imageRecord is what kubelet's image GC remembers of an image.
type imageRecord struct {
	firstDetected, lastUsed time.Time
	pinned                  bool
}

// DetectImages records the runtime's images (kubelet's detectImages: when each was first seen,
// when last in use by a container) and returns the ids in use. The agent calls it at start and
// every DetectPeriod, as kubelet's image GC loop does, so that an image's age counts from when the
// node first had it, not from the first reclaim.
func (c *Client) DetectImages(ctx context.Context) (map[string]bool, error) {
	now := c.now()
	cs, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListContainers: %w", err)
	}
	used := map[string]bool{}
	for _, ct := range cs.GetContainers() {
		// kubelet's image id of a container: ImageId, or ImageRef from runtimes older than CRI 1.30.
		id := ct.GetImageId()
		if id == "" {
			id = ct.GetImageRef()
		}
		used[id] = true
	}
	is, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListImages: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]*imageRecord{}
	for _, im := range is.GetImages() {
		rec := c.imageRecords[im.GetId()]
		if rec == nil {
			rec = &imageRecord{firstDetected: now}
		}
		if used[im.GetId()] {
			rec.lastUsed = now
		}
		rec.pinned = im.GetPinned()
		seen[im.GetId()] = rec
	}
	c.imageRecords = seen
	return used, nil
}

// removeUnusedImages is kubelet's DeleteUnusedImages: freeSpace with no byte goal.
func (c *Client) removeUnusedImages(ctx context.Context) (int, error) {
	used, err := c.DetectImages(ctx)
	if err != nil {
		return 0, err
	}
	freeTime := c.now()
	type candidate struct {
		id string
		imageRecord
	}
	var order []candidate
	c.mu.Lock()
	for id, rec := range c.imageRecords {
		if used[id] || rec.pinned {
			continue
		}
		order = append(order, candidate{id, *rec})
	}
	c.mu.Unlock()
	slices.SortFunc(order, func(a, b candidate) int {
		if a.lastUsed.Equal(b.lastUsed) {
			return a.firstDetected.Compare(b.firstDetected)
		}
		return a.lastUsed.Compare(b.lastUsed)
	})
	removed := 0
	for _, im := range order {
		if !im.lastUsed.Before(freeTime) || freeTime.Sub(im.firstDetected) < c.ImageMinAge {
			continue // used just now, or too new: it may be about to be used
		}
		if _, err := c.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: im.id}}); err != nil {
			c.log.Warn("removing an unused image failed", "image", im.id, "error", err)
			continue
		}
		c.mu.Lock()
		delete(c.imageRecords, im.id)
		c.mu.Unlock()
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

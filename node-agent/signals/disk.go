package signals

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// FSStats is one statfs(2) reading of a filesystem, in kubelet's terms.
type FSStats struct {
	// Path is the path that was measured.
	Path string
	// Device is the st_dev of Path: two paths on the same filesystem share it.
	Device uint64
	// Available is the space available to unprivileged users (f_bavail * f_frsize): kubelet's
	// <fs>.available. Capacity is f_blocks * f_frsize.
	Available, Capacity int64
	// InodesFree is f_ffree: kubelet's <fs>.inodesFree. Inodes is f_files.
	InodesFree, Inodes int64
}

// StatFS measures the filesystem holding path.
func StatFS(path string) (FSStats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return FSStats{}, err
	}
	var dev uint64
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		dev = uint64(s.Dev)
	}
	// cadvisor (and so kubelet) counts blocks in f_frsize, the unit f_blocks and f_bavail are in;
	// f_bsize is only the preferred I/O size and differs on some filesystems.
	frsize := uint64(st.Frsize)
	if frsize == 0 {
		frsize = uint64(st.Bsize)
	}
	return FSStats{
		Path: path, Device: dev,
		Available: clamp(st.Bavail * frsize), Capacity: clamp(st.Blocks * frsize),
		InodesFree: clamp(st.Ffree), Inodes: clamp(st.Files),
	}, nil
}

// FSPaths are the paths whose filesystems are nodefs, imagefs and containerfs. The zero value
// measures no filesystem.
type FSPaths struct {
	// NodeFS is on kubelet's root filesystem (its --root-dir, /var/lib/kubelet), e.g. "/".
	NodeFS string
	// ImageFS is where the container runtime keeps images (e.g. /var/lib/containerd); empty means
	// the same as NodeFS.
	ImageFS string
	// ContainerFS is where the runtime keeps the containers' writable layers; empty means the same
	// as ImageFS (the runtime keeps both together unless configured otherwise).
	ContainerFS string
}

// resolved returns the three paths with the defaults applied.
func (p FSPaths) resolved() (node, image, container string) {
	node = p.NodeFS
	image = cmpOr(p.ImageFS, node)
	container = cmpOr(p.ContainerFS, image)
	return node, image, container
}

// Layout tells the filesystem layout (seed 002) from the devices of the three measurements:
//   - imagefs on nodefs's filesystem: LayoutSingle (containerfs must be there too);
//   - imagefs separate, containerfs with imagefs: LayoutSplitDisk;
//   - imagefs separate, containerfs with nodefs: LayoutSplitImage.
//
// containerfs on a third filesystem is a layout kubelet does not support, and an error.
func Layout(node, image, container FSStats) (eviction.Layout, error) {
	switch {
	case image.Device == node.Device && container.Device == node.Device:
		return eviction.LayoutSingle, nil
	case image.Device == node.Device:
		return 0, fmt.Errorf("containerfs %s is on another filesystem than nodefs and imagefs %s: unsupported layout", container.Path, node.Path)
	case container.Device == image.Device:
		return eviction.LayoutSplitDisk, nil
	case container.Device == node.Device:
		return eviction.LayoutSplitImage, nil
	}
	return 0, fmt.Errorf("nodefs %s, imagefs %s and containerfs %s are on three filesystems: unsupported layout", node.Path, image.Path, container.Path)
}

// Disks measures nodefs, imagefs and containerfs and tells their layout.
func (p FSPaths) Disks() (node, image, container FSStats, layout eviction.Layout, err error) {
	np, ip, cp := p.resolved()
	if np == "" {
		return node, image, container, 0, fmt.Errorf("no nodefs path")
	}
	if node, err = StatFS(np); err != nil {
		return
	}
	if image, err = StatFS(ip); err != nil {
		return
	}
	if container, err = StatFS(cp); err != nil {
		return
	}
	layout, err = Layout(node, image, container)
	return
}

// fsSignals returns the six filesystem signals.
func fsSignals(node, image, container FSStats) []*agentv1.Signal {
	return []*agentv1.Signal{
		{Name: eviction.SignalNodeFSAvailable, Available: node.Available, Capacity: node.Capacity},
		{Name: eviction.SignalNodeFSInodesFree, Available: node.InodesFree, Capacity: node.Inodes},
		{Name: eviction.SignalImageFSAvailable, Available: image.Available, Capacity: image.Capacity},
		{Name: eviction.SignalImageFSInodesFree, Available: image.InodesFree, Capacity: image.Inodes},
		{Name: eviction.SignalContainerFSAvailable, Available: container.Available, Capacity: container.Capacity},
		{Name: eviction.SignalContainerFSInodesFree, Available: container.InodesFree, Capacity: container.Inodes},
	}
}

// Observations converts signals to the eviction package's input.
func Observations(sigs []*agentv1.Signal) eviction.Observations {
	out := make(eviction.Observations, len(sigs))
	for _, s := range sigs {
		out[s.Name] = eviction.Observation{Available: s.Available, Capacity: s.Capacity}
	}
	return out
}

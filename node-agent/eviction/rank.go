package eviction

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// QoSClass is a pod's Kubernetes quality of service class.
type QoSClass int

// The QoS classes.
const (
	BestEffort QoSClass = iota + 1
	Burstable
	Guaranteed
)

func (q QoSClass) String() string {
	switch q {
	case BestEffort:
		return "BestEffort"
	case Burstable:
		return "Burstable"
	case Guaranteed:
		return "Guaranteed"
	}
	return "QoSClass(?)"
}

// DiskUsage is a pod's use of one filesystem quantity (bytes or inodes), split the way kubelet
// measures it so that each filesystem layout can count the parts that live on the filesystem under
// pressure.
type DiskUsage struct {
	// LocalVolumes are the pod's emptyDir (non-memory) and other local volumes.
	LocalVolumes int64
	// Logs are the containers' logs.
	Logs int64
	// Writable are the containers' writable layers.
	Writable int64
	// Images is the image storage the pod's containers use (read-only layers).
	Images int64
}

// Pod is what ranking needs to know about a pod: identity, priority, QoS class, requests and usage.
// A pod source (the Kubernetes mode) fills it from the API and the container runtime.
type Pod struct {
	Namespace, Name, UID string
	// Priority is spec.priority (0 when unset).
	Priority int32
	// QoS is the pod's QoS class (informational: the ranking follows from requests and usage).
	QoS QoSClass
	// GracePeriod is the pod's terminationGracePeriodSeconds.
	GracePeriod time.Duration
	// MemoryRequest is the sum of the containers' memory requests; MemoryUsage the pod's working set.
	MemoryRequest, MemoryUsage int64
	// StorageRequest is the sum of the containers' ephemeral-storage requests, in bytes.
	StorageRequest int64
	// Disk is the pod's disk use in bytes, DiskInodes in inodes.
	Disk, DiskInodes DiskUsage
	// Processes is the number of processes (pids) the pod runs.
	Processes int64
	// MemoryUsageUnknown says the pod's memory usage could not be measured (no cgroup found):
	// MemoryUsage is then meaningless. Like kubelet with a pod it has no stats for, memory ranking
	// puts such pods first.
	MemoryUsageUnknown bool
	// DaemonSet says a DaemonSet owns the pod: evicting or deleting it through the API only makes
	// the DaemonSet controller put it back on the same node, so it is never a candidate.
	DaemonSet bool
	// Static says the pod is a static pod (seen through its mirror pod): the kubelet runs it from a
	// file and the API cannot remove it.
	Static bool
	// Critical is kubelet's critical pod: static, or of priority >= system-cluster-critical's. The
	// kubelet never evicts those for node pressure, and neither does the agent.
	Critical bool
}

// Evictable reports whether the pod may be proposed for a node-pressure eviction: not critical and
// not owned by a DaemonSet.
func (p *Pod) Evictable() bool { return !p.Critical && !p.Static && !p.DaemonSet }

func (p *Pod) key() string { return p.Namespace + "/" + p.Name }

// Cmp compares two pods for eviction: negative when a is to be evicted before b.
type Cmp func(a, b *Pod) int

// Sorter sorts pods by a chain of comparators: the first that tells two pods apart decides.
type Sorter []Cmp

// OrderedBy chains comparators, kubelet's orderedBy(...).Sort(pods).
func OrderedBy(cmps ...Cmp) Sorter { return cmps }

// Sort sorts pods in place, stably; pods no comparator tells apart are ordered by namespace/name so
// that the result never depends on the input order.
func (s Sorter) Sort(pods []Pod) {
	slices.SortStableFunc(pods, func(a, b Pod) int {
		for _, c := range s {
			if r := c(&a, &b); r != 0 {
				return r
			}
		}
		return strings.Compare(a.key(), b.key())
	})
}

// ByPriority evicts lower priorities first.
func ByPriority(a, b *Pod) int { return cmp.Compare(a.Priority, b.Priority) }

// ExceedsRequests evicts pods whose usage exceeds their request before pods within it.
func ExceedsRequests(usage, request func(*Pod) int64) Cmp {
	return func(a, b *Pod) int {
		ea, eb := usage(a) > request(a), usage(b) > request(b)
		switch {
		case ea == eb:
			return 0
		case ea:
			return -1
		}
		return 1
	}
}

// UnknownUsageFirst evicts pods whose usage could not be measured first, as kubelet does with
// pods it has no stats for.
func UnknownUsageFirst(unknown func(*Pod) bool) Cmp {
	return func(a, b *Pod) int {
		ua, ub := unknown(a), unknown(b)
		switch {
		case ua == ub:
			return 0
		case ua:
			return -1
		}
		return 1
	}
}

// UsageRelativeToRequest evicts the pod whose usage is further above its request first.
func UsageRelativeToRequest(usage, request func(*Pod) int64) Cmp {
	return func(a, b *Pod) int {
		return cmp.Compare(usage(b)-request(b), usage(a)-request(a))
	}
}

func memoryUsage(p *Pod) int64   { return p.MemoryUsage }
func memoryUnknown(p *Pod) bool  { return p.MemoryUsageUnknown }
func memoryRequest(p *Pod) int64 { return p.MemoryRequest }
func storageRequest(p *Pod) int64 {
	return p.StorageRequest
}

// diskParts says which parts of a pod's DiskUsage are on the filesystem behind a signal, per layout
// (seed 002, "pod selection for kubelet eviction").
type diskParts struct{ volumes, logs, writable, images bool }

func partsFor(signal string, layout Layout) diskParts {
	fs, _, _ := strings.Cut(signal, ".")
	all := diskParts{volumes: true, logs: true, writable: true}
	switch layout {
	case LayoutSplitDisk:
		if fs == "nodefs" {
			return diskParts{volumes: true, logs: true}
		}
		return diskParts{writable: true} // imagefs, and containerfs which follows it
	case LayoutSplitImage:
		if fs == "imagefs" {
			return diskParts{images: true}
		}
		return all // containerfs, and nodefs which is the same filesystem
	}
	return all
}

func (d diskParts) sum(u DiskUsage) int64 {
	var n int64
	if d.volumes {
		n += u.LocalVolumes
	}
	if d.logs {
		n += u.Logs
	}
	if d.writable {
		n += u.Writable
	}
	if d.images {
		n += u.Images
	}
	return n
}

// IsDiskSignal reports whether ranking for signal uses pods' disk use: the filesystem signals
// (nodefs, imagefs, containerfs; bytes and inodes), not memory or pids.
func IsDiskSignal(signal string) bool {
	return signal != SignalMemoryAvailable && signal != SignalAllocatableMemoryAvailable && signal != SignalPIDAvailable
}

// usageFor returns how much of the signal's resource a pod uses: what evicting it reclaims.
func usageFor(signal string, layout Layout) func(*Pod) int64 {
	switch {
	case signal == SignalMemoryAvailable || signal == SignalAllocatableMemoryAvailable:
		return memoryUsage
	case signal == SignalPIDAvailable:
		return func(p *Pod) int64 { return p.Processes }
	case strings.HasSuffix(signal, ".inodesFree"):
		parts := partsFor(signal, layout)
		return func(p *Pod) int64 { return parts.sum(p.DiskInodes) }
	}
	parts := partsFor(signal, layout)
	return func(p *Pod) int64 { return parts.sum(p.Disk) }
}

// SorterFor returns kubelet's ranking for a signal:
//   - memory: UnknownUsageFirst, ExceedsRequests, ByPriority, UsageRelativeToRequest on memory;
//   - inodes and pids: ByPriority only (they have no requests);
//   - disk bytes: the same three on ephemeral-storage, counting the parts of the pod's disk usage
//     that live on the signal's filesystem in the layout.
func SorterFor(signal string, layout Layout) Sorter {
	switch {
	case signal == SignalMemoryAvailable || signal == SignalAllocatableMemoryAvailable:
		return OrderedBy(UnknownUsageFirst(memoryUnknown), ExceedsRequests(memoryUsage, memoryRequest), ByPriority, UsageRelativeToRequest(memoryUsage, memoryRequest))
	case signal == SignalPIDAvailable || strings.HasSuffix(signal, ".inodesFree"):
		return OrderedBy(ByPriority)
	}
	usage := usageFor(signal, layout)
	return OrderedBy(ExceedsRequests(usage, storageRequest), ByPriority, UsageRelativeToRequest(usage, storageRequest))
}

// Rank returns a copy of pods in the order they are to be evicted for signal.
func Rank(signal string, layout Layout, pods []Pod) []Pod {
	out := slices.Clone(pods)
	SorterFor(signal, layout).Sort(out)
	return out
}

// Candidate is a pod proposed for eviction and the grace period it gets.
type Candidate struct {
	Namespace, Name, UID string
	GracePeriod          time.Duration
}

// EvictionGracePeriod is the grace period of a pod evicted for a threshold: 0 for a hard threshold;
// for a soft one the smaller of the pod's own and maxPodGrace (<= 0 counts as 0: without
// --eviction-max-pod-grace-period, kubelet kills at once).
func EvictionGracePeriod(hard bool, podGrace, maxPodGrace time.Duration) time.Duration {
	if hard {
		return 0
	}
	return max(min(podGrace, maxPodGrace), 0)
}

// Candidates ranks the evictable pods (see Pod.Evictable) for r's signal and returns the first
// ones whose combined usage of the signal's resource covers r.Need (the threshold plus its minimum
// reclaim, minus what is available), and always at least one while r.Need > 0, each with its
// eviction grace period. A pod whose memory usage is unknown ends the list for a memory signal: how
// much it frees cannot be told, so the next evaluation decides whether more is needed. Nothing is
// returned once the signal is back at its target.
func Candidates(r Reclaim, layout Layout, pods []Pod, maxPodGrace time.Duration) []Candidate {
	if r.Need <= 0 || len(pods) == 0 {
		return nil
	}
	evictable := make([]Pod, 0, len(pods))
	for _, p := range pods {
		if p.Evictable() {
			evictable = append(evictable, p)
		}
	}
	signal := r.Threshold.Signal
	isMemory := signal == SignalMemoryAvailable || signal == SignalAllocatableMemoryAvailable
	usage := usageFor(signal, layout)
	var out []Candidate
	var freed int64
	for _, p := range Rank(signal, layout, evictable) {
		out = append(out, Candidate{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
			GracePeriod: EvictionGracePeriod(r.Hard(), p.GracePeriod, maxPodGrace)})
		if isMemory && p.MemoryUsageUnknown {
			break
		}
		freed += usage(&p)
		if freed >= r.Need {
			break
		}
	}
	return out
}

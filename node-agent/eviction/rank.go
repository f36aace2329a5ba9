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
	// MemoryUsageUnknown says the pod's usage could not be measured (no cgroup found): MemoryUsage
	// and Processes are then meaningless. Like kubelet with a pod it has no stats for, memory and
	// pid ranking put such pods first.
	MemoryUsageUnknown bool
	// DaemonSet says a DaemonSet owns the pod. Like kubelet, node-pressure eviction still takes
	// it (only critical pods are refused); the graceful shutdown's Terminator skips it.
	DaemonSet bool
	// Static says the pod is a static pod (seen through its mirror pod): the kubelet runs it from a
	// file and the API cannot remove it. kubelet counts it critical.
	Static bool
	// Critical is kubelet's IsCriticalPod: static or mirror, or of priority >=
	// system-cluster-critical's. The kubelet never evicts those for node pressure, nor does the agent.
	Critical bool
	// Terminating says the pod is being deleted already (deletionTimestamp set): evicting it again
	// reclaims nothing more, so it is never chosen.
	Terminating bool
}

// Evictable reports whether the pod may be evicted for node pressure: not critical (kubelet's
// evictPod refuses only those) and not terminating already.
func (p *Pod) Evictable() bool { return !p.Critical && !p.Static && !p.Terminating }

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

// cmpBool is kubelet's cmpBool: a pod for which the condition holds comes first.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// ByPriority evicts lower priorities first (kubelet's priority).
func ByPriority(a, b *Pod) int { return cmp.Compare(a.Priority, b.Priority) }

// ExceedsRequests evicts pods whose usage exceeds their request before pods within it (kubelet's
// exceedMemoryRequests and exceedDiskRequests). Like kubelet, when either pod has no stats the
// one without comes first and usage is not looked at.
func ExceedsRequests(known func(*Pod) bool, usage, request func(*Pod) int64) Cmp {
	return func(a, b *Pod) int {
		if ka, kb := known(a), known(b); !ka || !kb {
			return cmpBool(!ka, !kb)
		}
		return cmpBool(usage(a) > request(a), usage(b) > request(b))
	}
}

// UsageRelativeToRequest evicts the pod whose usage is further above its request first (kubelet's
// memory and disk comparators), pods without stats first.
func UsageRelativeToRequest(known func(*Pod) bool, usage, request func(*Pod) int64) Cmp {
	return func(a, b *Pod) int {
		if ka, kb := known(a), known(b); !ka || !kb {
			return cmpBool(!ka, !kb)
		}
		return cmp.Compare(usage(b)-request(b), usage(a)-request(a))
	}
}

// ByProcesses evicts the pod running more processes first (kubelet's process), pods without stats
// first.
func ByProcesses(a, b *Pod) int {
	if ka, kb := !a.MemoryUsageUnknown, !b.MemoryUsageUnknown; !ka || !kb {
		return cmpBool(!ka, !kb)
	}
	return cmp.Compare(b.Processes, a.Processes)
}

func memoryUsage(p *Pod) int64   { return p.MemoryUsage }
func memoryKnown(p *Pod) bool    { return !p.MemoryUsageUnknown }
func memoryRequest(p *Pod) int64 { return p.MemoryRequest }
func storageRequest(p *Pod) int64 {
	return p.StorageRequest
}
func noRequest(*Pod) int64 { return 0 }
func diskKnown(*Pod) bool  { return true }

// diskParts says which parts of a pod's DiskUsage are on the filesystem behind a signal, per layout
// (seed 002, "pod selection for kubelet eviction"; kubelet's buildSignalToRankFunc). Image layers
// never count: kubelet lists fsStatsImages for some signals, but its podDiskUsage only adds the
// writable layers (root), logs and local volumes, so an imagefs-only signal ranks every pod at 0.
type diskParts struct{ volumes, logs, writable bool }

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
			return diskParts{}
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
	return n
}

// IsDiskSignal reports whether ranking for signal uses pods' disk use: the filesystem signals
// (nodefs, imagefs, containerfs; bytes and inodes), not memory or pids.
func IsDiskSignal(signal string) bool {
	return !IsMemorySignal(signal) && signal != SignalPIDAvailable
}

// IsMemorySignal reports whether signal is memory.available or allocatableMemory.available.
func IsMemorySignal(signal string) bool {
	return signal == SignalMemoryAvailable || signal == SignalAllocatableMemoryAvailable
}

// usageFor returns how much of the signal's resource a pod uses: what evicting it reclaims.
func usageFor(signal string, layout Layout) func(*Pod) int64 {
	switch {
	case IsMemorySignal(signal):
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
//   - memory (rankMemoryPressure): ExceedsRequests, ByPriority, UsageRelativeToRequest on memory;
//   - pids (rankPIDPressure): ByPriority, then ByProcesses;
//   - disk bytes (rankDiskPressureFunc): the same three as memory on ephemeral storage, counting
//     the parts of the pod's disk use on the signal's filesystem in the layout;
//   - inodes (rankDiskPressureFunc on inodes): "uses any" (inodes have no request, so any use
//     exceeds it), ByPriority, then inodes used minus the ephemeral-storage request — kubelet
//     subtracts the storage request (bytes) from the inode count, and so does this.
func SorterFor(signal string, layout Layout) Sorter {
	usage := usageFor(signal, layout)
	switch {
	case IsMemorySignal(signal):
		return OrderedBy(ExceedsRequests(memoryKnown, memoryUsage, memoryRequest), ByPriority, UsageRelativeToRequest(memoryKnown, memoryUsage, memoryRequest))
	case signal == SignalPIDAvailable:
		return OrderedBy(ByPriority, ByProcesses)
	case strings.HasSuffix(signal, ".inodesFree"):
		return OrderedBy(ExceedsRequests(diskKnown, usage, noRequest), ByPriority, UsageRelativeToRequest(diskKnown, usage, storageRequest))
	}
	return OrderedBy(ExceedsRequests(diskKnown, usage, storageRequest), ByPriority, UsageRelativeToRequest(diskKnown, usage, storageRequest))
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

// Next is kubelet's synchronize choice: the first pod, in the ranking for r's signal, that may be
// evicted (see Pod.Evictable), with its eviction grace period. kubelet evicts one pod per
// housekeeping interval and then waits for its resources to be reclaimed; ok is false when there
// is nothing to reclaim or no pod to evict.
func Next(r Reclaim, layout Layout, pods []Pod, maxPodGrace time.Duration) (c Candidate, ok bool) {
	if r.Need <= 0 || len(pods) == 0 {
		return Candidate{}, false
	}
	for _, p := range Rank(r.Threshold.Signal, layout, pods) {
		if p.Evictable() {
			return Candidate{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
				GracePeriod: EvictionGracePeriod(r.Hard(), p.GracePeriod, maxPodGrace)}, true
		}
	}
	return Candidate{}, false
}

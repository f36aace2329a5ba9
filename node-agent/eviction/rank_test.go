package eviction

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func names(pods []Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// TestRankMemory follows seed 002: BestEffort and Burstable pods above their requests first, by
// priority, then by how far above; Guaranteed and Burstable pods within their requests last, by
// priority.
func TestRankMemory(t *testing.T) {
	pods := []Pod{
		{Name: "guaranteed-low", QoS: Guaranteed, Priority: 0, MemoryRequest: 1 * gi, MemoryUsage: gi / 2},
		{Name: "guaranteed-high", QoS: Guaranteed, Priority: 1000, MemoryRequest: 1 * gi, MemoryUsage: gi / 2},
		{Name: "burstable-within", QoS: Burstable, Priority: 0, MemoryRequest: 1 * gi, MemoryUsage: 100 * mi},
		{Name: "besteffort-small", QoS: BestEffort, Priority: 0, MemoryUsage: 10 * mi},
		{Name: "besteffort-big", QoS: BestEffort, Priority: 0, MemoryUsage: 500 * mi},
		{Name: "burstable-over-high", QoS: Burstable, Priority: 1000, MemoryRequest: 100 * mi, MemoryUsage: 2 * gi},
		{Name: "burstable-over", QoS: Burstable, Priority: 0, MemoryRequest: 100 * mi, MemoryUsage: 300 * mi},
	}
	want := []string{
		"besteffort-big",      // above request by 500Mi
		"burstable-over",      // above by 200Mi
		"besteffort-small",    // above by 10Mi
		"burstable-over-high", // above its request, but higher priority
		"guaranteed-low",      // within requests: by priority, then usage relative to request (-512Mi)
		"burstable-within",    // -924Mi
		"guaranteed-high",
	}
	if diff := cmp.Diff(want, names(Rank(SignalMemoryAvailable, LayoutSingle, pods))); diff != "" {
		t.Errorf("memory ranking (-want +got):\n%s", diff)
	}
}

// kubelet's priorities in its eviction tests.
const (
	lowPriority  = -1
	highPriority = 1
)

// TestRankKubeletTables are kubelet's helpers_test.go ranking tables for the comparators the
// agent ranks with, as pods with the usage kubelet's stats give them.
func TestRankKubeletTables(t *testing.T) {
	tests := []struct {
		name   string
		sorter Sorter
		pods   []Pod
		want   []string
	}{
		{"TestOrderedByExceedsRequestMemory", OrderedBy(ExceedsRequests(memoryKnown, memoryUsage, memoryRequest)), []Pod{
			{Name: "below-requests", Priority: -1, MemoryRequest: 200 * mi, MemoryUsage: 199 * mi},
			{Name: "exceeds-requests", Priority: 1, MemoryRequest: 100 * mi, MemoryUsage: 101 * mi},
		}, []string{"exceeds-requests", "below-requests"}},
		{"TestOrderedByPriority", OrderedBy(ByPriority), []Pod{
			{Name: "high-priority", Priority: 12534}, {Name: "medium-priority", Priority: 1}, {Name: "low-priority", Priority: -134},
		}, []string{"low-priority", "medium-priority", "high-priority"}},
		{"TestOrderedbyInodes", OrderedBy(UsageRelativeToRequest(diskKnown, usageFor(SignalNodeFSInodesFree, LayoutSingle), storageRequest)), []Pod{
			{Name: "low", DiskInodes: DiskUsage{Writable: 50000, Logs: 100000, LocalVolumes: 50000}},
			{Name: "medium", DiskInodes: DiskUsage{Writable: 100000, Logs: 150000, LocalVolumes: 50000}},
			{Name: "high", DiskInodes: DiskUsage{Writable: 200000, Logs: 150000, LocalVolumes: 50000}},
		}, []string{"high", "medium", "low"}},
		{"TestOrderedByPriorityInodes", OrderedBy(ByPriority, UsageRelativeToRequest(diskKnown, usageFor(SignalNodeFSInodesFree, LayoutSingle), storageRequest)), []Pod{
			{Name: "high-priority-low-usage", Priority: highPriority, DiskInodes: DiskUsage{Writable: 10000, Logs: 40000, LocalVolumes: 100000}},
			{Name: "high-priority-high-usage", Priority: highPriority, DiskInodes: DiskUsage{Writable: 150000, Logs: 150000, LocalVolumes: 50000}},
			{Name: "low-priority-low-usage", Priority: lowPriority, DiskInodes: DiskUsage{Writable: 60000, Logs: 30000, LocalVolumes: 10000}},
			{Name: "low-priority-high-usage", Priority: lowPriority, DiskInodes: DiskUsage{Writable: 50000, Logs: 100000, LocalVolumes: 250000}},
		}, []string{"low-priority-high-usage", "low-priority-low-usage", "high-priority-high-usage", "high-priority-low-usage"}},
		{"TestOrderedByPriorityProcess", OrderedBy(ByPriority, ByProcesses), []Pod{
			{Name: "high-priority-low-usage", Priority: highPriority, Processes: 5},
			{Name: "high-priority-high-usage", Priority: highPriority, Processes: 20},
			{Name: "low-priority-low-usage", Priority: lowPriority, Processes: 6},
			{Name: "low-priority-high-usage", Priority: lowPriority, Processes: 20},
		}, []string{"low-priority-high-usage", "low-priority-low-usage", "high-priority-high-usage", "high-priority-low-usage"}},
		{"TestOrderedByMemory", OrderedBy(UsageRelativeToRequest(memoryKnown, memoryUsage, memoryRequest)), []Pod{
			{Name: "best-effort-high", MemoryUsage: 500 * mi},
			{Name: "best-effort-low", MemoryUsage: 300 * mi},
			{Name: "burstable-high", MemoryRequest: 100 * mi, MemoryUsage: 800 * mi},
			{Name: "burstable-low", MemoryRequest: 100 * mi, MemoryUsage: 300 * mi},
			{Name: "guaranteed-high", MemoryRequest: 1 * gi, MemoryUsage: 800 * mi},
			{Name: "guaranteed-low", MemoryRequest: 1 * gi, MemoryUsage: 200 * mi},
		}, []string{"burstable-high", "best-effort-high", "best-effort-low", "burstable-low", "guaranteed-high", "guaranteed-low"}},
		// The signals' full sorters, with kubelet's tie-breaks by usage within a priority.
		{"rankPIDPressure", SorterFor(SignalPIDAvailable, LayoutSingle), []Pod{
			{Name: "b", Priority: 10, Processes: 1000}, {Name: "a", Priority: 10, Processes: 1},
			{Name: "c", Priority: -5, Processes: 1}, {Name: "d", Priority: 100, Processes: 5000},
			{Name: "unknown", Priority: 100, MemoryUsageUnknown: true},
		}, []string{"c", "b", "a", "unknown", "d"}},
		{"rankDiskPressureFunc/inodes: uses any, priority, inodes", SorterFor(SignalNodeFSInodesFree, LayoutSingle), []Pod{
			{Name: "none-low", Priority: -1},
			{Name: "some-high", Priority: 100, DiskInodes: DiskUsage{Logs: 10}},
			{Name: "many-high", Priority: 100, DiskInodes: DiskUsage{LocalVolumes: 1000}},
			{Name: "few-high-requested", Priority: 100, StorageRequest: 5000, DiskInodes: DiskUsage{LocalVolumes: 2000}},
		}, []string{"many-high", "some-high", "few-high-requested", "none-low"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every input order gives the same ranking.
			for _, in := range [][]Pod{tt.pods, reversed(tt.pods)} {
				got := slices.Clone(in)
				tt.sorter.Sort(got)
				if diff := cmp.Diff(tt.want, names(got)); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
			}
		})
	}
}

func reversed(p []Pod) []Pod {
	out := slices.Clone(p)
	slices.Reverse(out)
	return out
}

// TestRankDiskLayouts is seed 002's table of what each filesystem layout measures (kubelet's
// buildSignalToRankFunc; image layers never count, as in kubelet's podDiskUsage).
func TestRankDiskLayouts(t *testing.T) {
	// Each pod is big in one part only; same priority, no requests.
	pods := []Pod{
		{Name: "volumes", Disk: DiskUsage{LocalVolumes: 40 * gi, Logs: 0, Writable: 1 * gi}},
		{Name: "logs", Disk: DiskUsage{LocalVolumes: 0, Logs: 30 * gi, Writable: 2 * gi}},
		{Name: "writable", Disk: DiskUsage{LocalVolumes: 1 * gi, Logs: 1 * gi, Writable: 50 * gi}},
		{Name: "small", Disk: DiskUsage{LocalVolumes: 2 * gi, Logs: 2 * gi, Writable: 3 * gi}},
	}
	tests := []struct {
		layout Layout
		signal string
		want   []string
	}{
		// Single nodefs: volumes + logs + writable layers.
		{LayoutSingle, SignalNodeFSAvailable, []string{"writable", "volumes", "logs", "small"}},
		{LayoutSingle, SignalImageFSAvailable, []string{"writable", "volumes", "logs", "small"}},
		// Split disk: nodefs counts volumes + logs; imagefs the writable layers.
		{LayoutSplitDisk, SignalNodeFSAvailable, []string{"volumes", "logs", "small", "writable"}},
		{LayoutSplitDisk, SignalImageFSAvailable, []string{"writable", "small", "logs", "volumes"}},
		// Split image: containerfs counts volumes + logs + writable; imagefs nothing a pod owns.
		{LayoutSplitImage, SignalContainerFSAvailable, []string{"writable", "volumes", "logs", "small"}},
		{LayoutSplitImage, SignalImageFSAvailable, []string{"logs", "small", "volumes", "writable"}},
	}
	for _, tt := range tests {
		t.Run(tt.layout.String()+"/"+tt.signal, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, names(Rank(tt.signal, tt.layout, pods))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestRankDiskRequestsAndPriority(t *testing.T) {
	pods := []Pod{
		{Name: "within-request", Priority: 0, StorageRequest: 100 * gi, Disk: DiskUsage{LocalVolumes: 90 * gi}},
		{Name: "over-high", Priority: 1000, StorageRequest: 1 * gi, Disk: DiskUsage{LocalVolumes: 2 * gi}},
		{Name: "over-low", Priority: 0, StorageRequest: 1 * gi, Disk: DiskUsage{LocalVolumes: 2 * gi}},
	}
	want := []string{"over-low", "over-high", "within-request"}
	if diff := cmp.Diff(want, names(Rank(SignalNodeFSAvailable, LayoutSingle, pods))); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestEvictionGracePeriod(t *testing.T) {
	tests := []struct {
		hard               bool
		pod, max, expected time.Duration
	}{
		{true, 30 * time.Second, 60 * time.Second, 0},
		{false, 30 * time.Second, 60 * time.Second, 30 * time.Second},
		{false, 90 * time.Second, 60 * time.Second, 60 * time.Second},
		{false, 30 * time.Second, 0, 0}, // no --eviction-max-pod-grace-period: killed at once (seed)
		{false, 30 * time.Second, -1, 0},
	}
	for _, tt := range tests {
		if got := EvictionGracePeriod(tt.hard, tt.pod, tt.max); got != tt.expected {
			t.Errorf("EvictionGracePeriod(%v, %v, %v) = %v, want %v", tt.hard, tt.pod, tt.max, got, tt.expected)
		}
	}
}

// TestNext is kubelet's synchronize choice: one pod per interval, the first evictable in the
// ranking. Critical and static pods are refused (kubelet's evictPod), DaemonSet pods are not;
// terminating pods are skipped; a pod without stats comes first (kubelet's "no stats" rule).
func TestNext(t *testing.T) {
	soft := Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: gi}, GracePeriod: time.Minute}
	hard := Reclaim{Threshold: Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: gi}}, Need: 10 * gi}
	tests := []struct {
		name string
		r    Reclaim
		pods []Pod
		want *Candidate
	}{
		{"nothing needed", Reclaim{Threshold: hard.Threshold, Need: 0}, []Pod{{Name: "a"}}, nil},
		{"one pod even when the need is larger", hard, []Pod{
			{Name: "a", UID: "ua", MemoryUsage: 300 * mi, GracePeriod: 30 * time.Second},
			{Name: "b", UID: "ub", MemoryUsage: 200 * mi, GracePeriod: 30 * time.Second},
		}, &Candidate{Name: "a", UID: "ua"}},
		{"soft: min of the pod's grace and the max", Reclaim{Threshold: soft, Need: 1}, []Pod{
			{Name: "a", UID: "ua", MemoryUsage: 300 * mi, GracePeriod: 30 * time.Second},
		}, &Candidate{Name: "a", UID: "ua", GracePeriod: 10 * time.Second}},
		{"critical, static and terminating skipped; DaemonSet taken", hard, []Pod{
			{Name: "critical", MemoryUsage: 5 * gi, Critical: true},
			{Name: "static", MemoryUsage: 5 * gi, Static: true},
			{Name: "terminating", MemoryUsage: 5 * gi, Terminating: true},
			{Name: "daemonset", MemoryUsage: 4 * gi, DaemonSet: true},
			{Name: "plain", MemoryUsage: 100 * mi},
		}, &Candidate{Name: "daemonset"}},
		{"unknown first", hard, []Pod{
			{Name: "big", MemoryUsage: 5 * gi},
			{Name: "unknown", MemoryUsageUnknown: true},
		}, &Candidate{Name: "unknown"}},
		{"only critical", hard, []Pod{{Name: "c", Critical: true}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := Next(tt.r, LayoutSingle, tt.pods, 10*time.Second)
			var got *Candidate
			if ok {
				got = &c
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

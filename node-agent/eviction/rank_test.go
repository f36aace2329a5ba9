package eviction

import (
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

func TestRankPIDAndInodesByPriorityOnly(t *testing.T) {
	pods := []Pod{
		{Name: "b", Priority: 10, Processes: 1000, DiskInodes: DiskUsage{Writable: 1e6}},
		{Name: "a", Priority: 10, Processes: 1},
		{Name: "c", Priority: -5, Processes: 1},
		{Name: "d", Priority: 100, Processes: 5000, DiskInodes: DiskUsage{Writable: 1e7}},
	}
	want := []string{"c", "a", "b", "d"} // ties by name, usage ignored
	for _, s := range []string{SignalPIDAvailable, SignalNodeFSInodesFree, SignalImageFSInodesFree} {
		if diff := cmp.Diff(want, names(Rank(s, LayoutSplitDisk, pods))); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s, diff)
		}
	}
}

// TestRankDiskLayouts is seed 002's table of what each filesystem layout measures.
func TestRankDiskLayouts(t *testing.T) {
	// Each pod is big in one part only; same priority, no requests.
	pods := []Pod{
		{Name: "volumes", Disk: DiskUsage{LocalVolumes: 40 * gi, Logs: 0, Writable: 1 * gi, Images: 1 * gi}},
		{Name: "logs", Disk: DiskUsage{LocalVolumes: 0, Logs: 30 * gi, Writable: 2 * gi, Images: 2 * gi}},
		{Name: "writable", Disk: DiskUsage{LocalVolumes: 1 * gi, Logs: 1 * gi, Writable: 50 * gi, Images: 3 * gi}},
		{Name: "images", Disk: DiskUsage{LocalVolumes: 2 * gi, Logs: 2 * gi, Writable: 3 * gi, Images: 60 * gi}},
	}
	tests := []struct {
		layout Layout
		signal string
		want   []string
	}{
		// Single nodefs: volumes + logs + writable layers.
		{LayoutSingle, SignalNodeFSAvailable, []string{"writable", "volumes", "logs", "images"}},
		{LayoutSingle, SignalImageFSAvailable, []string{"writable", "volumes", "logs", "images"}},
		// Split disk: nodefs counts volumes + logs; imagefs the writable layers.
		{LayoutSplitDisk, SignalNodeFSAvailable, []string{"volumes", "logs", "images", "writable"}},
		{LayoutSplitDisk, SignalImageFSAvailable, []string{"writable", "images", "logs", "volumes"}},
		// Split image: containerfs counts volumes + logs + writable; imagefs the image storage.
		{LayoutSplitImage, SignalContainerFSAvailable, []string{"writable", "volumes", "logs", "images"}},
		{LayoutSplitImage, SignalImageFSAvailable, []string{"images", "writable", "logs", "volumes"}},
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

func TestCandidatesCoverMinimumReclaim(t *testing.T) {
	pods := []Pod{
		{Name: "a", UID: "ua", MemoryUsage: 300 * mi, GracePeriod: 30 * time.Second},
		{Name: "b", UID: "ub", MemoryUsage: 200 * mi, GracePeriod: 30 * time.Second},
		{Name: "c", UID: "uc", MemoryUsage: 100 * mi, GracePeriod: 30 * time.Second},
	}
	soft := Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: gi}, GracePeriod: time.Minute}
	hard := Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: gi}}
	tests := []struct {
		name string
		r    Reclaim
		want []Candidate
	}{
		{"nothing needed", Reclaim{Threshold: hard, Need: 0}, nil},
		{"one pod covers it", Reclaim{Threshold: hard, Need: 250 * mi}, []Candidate{{Name: "a", UID: "ua"}}},
		{"min reclaim needs two", Reclaim{Threshold: soft, Need: 450 * mi}, []Candidate{
			{Name: "a", UID: "ua", GracePeriod: 10 * time.Second}, {Name: "b", UID: "ub", GracePeriod: 10 * time.Second}}},
		{"more than all", Reclaim{Threshold: hard, Need: 10 * gi}, []Candidate{{Name: "a", UID: "ua"}, {Name: "b", UID: "ub"}, {Name: "c", UID: "uc"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Candidates(tt.r, LayoutSingle, pods, 10*time.Second)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestCandidatesSkipUnevictableAndStopAtUnknown: critical, static and DaemonSet pods are never
// proposed; a pod of unknown memory usage comes first (kubelet's "no stats" rule) and ends the list.
func TestCandidatesSkipUnevictableAndStopAtUnknown(t *testing.T) {
	hard := Reclaim{Threshold: Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: gi}}, Need: 10 * gi}
	tests := []struct {
		name string
		pods []Pod
		want []string
	}{
		{"unevictable skipped", []Pod{
			{Name: "critical", MemoryUsage: 5 * gi, Critical: true},
			{Name: "static", MemoryUsage: 5 * gi, Static: true},
			{Name: "daemonset", MemoryUsage: 5 * gi, DaemonSet: true},
			{Name: "plain", MemoryUsage: 100 * mi},
		}, []string{"plain"}},
		{"unknown first and last", []Pod{
			{Name: "big", MemoryUsage: 5 * gi},
			{Name: "unknown", MemoryUsageUnknown: true},
			{Name: "small", MemoryUsage: 100 * mi},
		}, []string{"unknown"}},
		{"only unevictable", []Pod{{Name: "ds", DaemonSet: true}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range Candidates(hard, LayoutSingle, tt.pods, 0) {
				got = append(got, c.Name)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

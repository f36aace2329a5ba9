package kubepods

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/signals"
)

const fixtureUID = "1111aaaa-0000-4000-8000-000000000001"

func TestPodCgroup(t *testing.T) {
	tests := []struct {
		driver CgroupDriver
		qos    eviction.QoSClass
		want   string
	}{
		{CgroupDriverCgroupfs, eviction.Guaranteed, "kubepods/pod" + fixtureUID},
		{CgroupDriverCgroupfs, eviction.Burstable, "kubepods/burstable/pod" + fixtureUID},
		{CgroupDriverCgroupfs, eviction.BestEffort, "kubepods/besteffort/pod" + fixtureUID},
		{CgroupDriverSystemd, eviction.Guaranteed, "kubepods.slice/kubepods-pod1111aaaa_0000_4000_8000_000000000001.slice"},
		{CgroupDriverSystemd, eviction.Burstable, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111aaaa_0000_4000_8000_000000000001.slice"},
		{CgroupDriverSystemd, eviction.BestEffort, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1111aaaa_0000_4000_8000_000000000001.slice"},
	}
	for _, tt := range tests {
		if got := PodCgroup(tt.driver, tt.qos, fixtureUID); got != tt.want {
			t.Errorf("PodCgroup(%v, %v) = %q; want %q", tt.driver, tt.qos, got, tt.want)
		}
	}
}

// TestCgroupsRead reads the fixtures: each layout of testdata/ holds one pod cgroup.
func TestCgroupsRead(t *testing.T) {
	const mi = 1 << 20
	tests := []struct {
		name    string
		cg      Cgroups
		qos     eviction.QoSClass
		want    Usage
		ok      bool
		wantErr bool
	}{
		{"v1 cgroupfs", Cgroups{Root: "testdata/v1-cgroupfs", Driver: CgroupDriverCgroupfs}, eviction.Guaranteed,
			Usage{MemoryWorkingSet: 200 * mi, Processes: 7, Dir: "testdata/v1-cgroupfs/memory/kubepods/pod" + fixtureUID}, true, false},
		{"v1 cgroupfs, driver detected", Cgroups{Root: "testdata/v1-cgroupfs"}, eviction.Guaranteed,
			Usage{MemoryWorkingSet: 200 * mi, Processes: 7, Dir: "testdata/v1-cgroupfs/memory/kubepods/pod" + fixtureUID}, true, false},
		{"v1 systemd, inactive above usage floors at 0, no pids", Cgroups{Root: "testdata/v1-systemd", Version: signals.CgroupV1}, eviction.Burstable,
			Usage{MemoryWorkingSet: 0, Dir: "testdata/v1-systemd/memory/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111aaaa_0000_4000_8000_000000000001.slice"}, true, false},
		{"v2 cgroupfs", Cgroups{Root: "testdata/v2-cgroupfs"}, eviction.BestEffort,
			Usage{MemoryWorkingSet: 768 * mi, Processes: 42, Dir: "testdata/v2-cgroupfs/kubepods/besteffort/pod" + fixtureUID}, true, false},
		{"v2 systemd", Cgroups{Root: "testdata/v2-systemd", Driver: CgroupDriverSystemd}, eviction.Guaranteed,
			Usage{MemoryWorkingSet: 9 * mi, Processes: 1, Dir: "testdata/v2-systemd/kubepods.slice/kubepods-pod1111aaaa_0000_4000_8000_000000000001.slice"}, true, false},
		{"hybrid reads the v1 memory controller", Cgroups{Root: "testdata/hybrid"}, eviction.Burstable,
			Usage{MemoryWorkingSet: 200 * mi, Dir: "testdata/hybrid/memory/kubepods/burstable/pod" + fixtureUID}, true, false},
		{"v1 cgroupfs under the kubelet's --cgroup-root", Cgroups{Root: "testdata/v1-cgroup-root", KubeletRoot: "/nf-node-1"}, eviction.Guaranteed,
			Usage{MemoryWorkingSet: 200 * mi, Processes: 7, Dir: "testdata/v1-cgroup-root/memory/nf-node-1/kubepods/pod" + fixtureUID}, true, false},
		{"kubelet's --cgroup-root not given: no cgroup, unknown", Cgroups{Root: "testdata/v1-cgroup-root"}, eviction.Guaranteed, Usage{}, false, false},
		{"wrong QoS tier: no cgroup, unknown", Cgroups{Root: "testdata/v1-cgroupfs"}, eviction.BestEffort, Usage{}, false, false},
		{"wrong driver: no cgroup, unknown", Cgroups{Root: "testdata/v2-cgroupfs", Driver: CgroupDriverSystemd}, eviction.BestEffort, Usage{}, false, false},
		{"no cgroup hierarchy at all", Cgroups{Root: "testdata/nonexistent"}, eviction.BestEffort, Usage{}, false, true},
		{"memory.stat without inactive_file", Cgroups{Root: "testdata/broken"}, eviction.Guaranteed, Usage{}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := tt.cg.Read(tt.qos, fixtureUID)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v; want error %v", err, tt.wantErr)
			}
			if ok != tt.ok {
				t.Errorf("ok = %v; want %v", ok, tt.ok)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseCgroupDriver(t *testing.T) {
	for in, want := range map[string]CgroupDriver{"": CgroupDriverAuto, "auto": CgroupDriverAuto, "cgroupfs": CgroupDriverCgroupfs, "systemd": CgroupDriverSystemd} {
		if got, err := ParseCgroupDriver(in); err != nil || got != want {
			t.Errorf("ParseCgroupDriver(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"Systemd", "cgroup", "none"} {
		if _, err := ParseCgroupDriver(bad); err == nil {
			t.Errorf("ParseCgroupDriver(%q) succeeded", bad)
		}
	}
}

package signals

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

const (
	gi = 1 << 30
	mi = 1 << 20
)

func TestComputeMemory(t *testing.T) {
	tests := []struct {
		name                      string
		capacity, usage, inactive uint64
		wantWS, wantAvail         int64
	}{
		{name: "normal", capacity: 16 * gi, usage: 4 * gi, inactive: gi, wantWS: 3 * gi, wantAvail: 13 * gi},
		{name: "inactive above usage floors working set", capacity: 16 * gi, usage: gi, inactive: 2 * gi, wantWS: 0, wantAvail: 16 * gi},
		{name: "working set above capacity floors available", capacity: gi, usage: 3 * gi, inactive: 0, wantWS: 3 * gi, wantAvail: 0},
		{name: "huge values clamp", capacity: math.MaxUint64, usage: 0, inactive: 0, wantWS: 0, wantAvail: math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := ComputeMemory(tt.capacity, tt.usage, tt.inactive)
			if m.WorkingSet != tt.wantWS || m.Available != tt.wantAvail {
				t.Errorf("ComputeMemory(%d, %d, %d) = ws %d avail %d; want ws %d avail %d",
					tt.capacity, tt.usage, tt.inactive, m.WorkingSet, m.Available, tt.wantWS, tt.wantAvail)
			}
		})
	}
}

func TestReaderFixtures(t *testing.T) {
	const capacity = 16 * gi // testdata/proc/meminfo MemTotal
	tests := []struct {
		name        string
		reader      Reader
		wantVersion CgroupVersion
		wantWS      int64
		wantErr     bool
	}{
		// usage 4Gi, total_inactive_file 1Gi (inactive_file, the non-hierarchical key, is ignored).
		{name: "v1 auto", reader: Reader{CgroupRoot: "testdata/v1"}, wantVersion: CgroupV1, wantWS: 3 * gi},
		{name: "v1 forced", reader: Reader{CgroupRoot: "testdata/v1", CgroupVersion: CgroupV1}, wantVersion: CgroupV1, wantWS: 3 * gi},
		// Root has no memory.current: anon 2Gi + file 3Gi - inactive_file 1Gi.
		{name: "v2 root auto", reader: Reader{CgroupRoot: "testdata/v2"}, wantVersion: CgroupV2, wantWS: 4 * gi},
		// memory.current 2Gi - inactive_file 512Mi.
		{name: "v2 child", reader: Reader{CgroupRoot: "testdata/v2", CgroupPath: "kubepods"}, wantVersion: CgroupV2, wantWS: 2*gi - 512*mi},
		{name: "v2 child missing", reader: Reader{CgroupRoot: "testdata/v2", CgroupPath: "nope"}, wantVersion: CgroupV2, wantErr: true},
		{name: "v2 forced on v1 root", reader: Reader{CgroupRoot: "testdata/v1", CgroupVersion: CgroupV2, CgroupPath: "x"}, wantVersion: CgroupV2, wantErr: true},
		// A hybrid host uses v1 by default, like kubelet.
		{name: "hybrid auto", reader: Reader{CgroupRoot: "testdata/hybrid"}, wantVersion: CgroupV1, wantWS: 3 * gi},
		// unified/ has no memory controller: MemTotal 16Gi - MemFree 8Gi - Inactive(file) 1Gi.
		{name: "hybrid forced v2", reader: Reader{CgroupRoot: "testdata/hybrid", CgroupVersion: CgroupV2}, wantVersion: CgroupV2, wantWS: 7 * gi},
		{name: "no cgroups", reader: Reader{CgroupRoot: "testdata/proc"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.reader.ProcRoot = "testdata/proc"
			v, _, err := tt.reader.Detect()
			if err == nil && v != tt.wantVersion {
				t.Errorf("Detect() = %v; want %v", v, tt.wantVersion)
			}
			m, err := tt.reader.Memory()
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Memory() = %+v; want an error", m)
				}
				t.Logf("error (expected): %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", m)
			if m.Capacity != capacity || m.WorkingSet != tt.wantWS || m.Available != capacity-tt.wantWS {
				t.Errorf("Memory() = %+v; want capacity %d working set %d available %d", m, capacity, tt.wantWS, capacity-tt.wantWS)
			}
		})
	}
}

func TestReaderRead(t *testing.T) {
	r := Reader{ProcRoot: "testdata/proc", CgroupRoot: "testdata/v1"}
	got, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := []*agentv1.Signal{
		{Name: "memory.available", Available: 13 * gi, Capacity: 16 * gi},
		// min(pid_max 4194304, threads-max 126000) - 300 tasks.
		{Name: "pid.available", Available: 126000 - 300, Capacity: 126000},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("Read() (-want +got):\n%s", diff)
	}

	s := HostSampler{Reader: r, Now: func() time.Time { return time.Unix(100, 0) }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sample, err := s.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, sample.Signals, protocmp.Transform()); diff != "" || sample.ObservedAt.AsTime() != time.Unix(100, 0).UTC() {
		t.Errorf("Sample() = %v (signals -want +got):\n%s", sample, diff)
	}

	c, err := r.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	if c.MemoryBytes != 16*gi || c.Pids != 4194304 || c.CpuMillis <= 0 {
		t.Errorf("Capacity() = %v", c)
	}
}

// TestReaderHost reads the real machine, through each hierarchy it has.
func TestReaderHost(t *testing.T) {
	versions := []CgroupVersion{CgroupAuto}
	if exists("/sys/fs/cgroup/memory/memory.usage_in_bytes") {
		versions = append(versions, CgroupV1)
	}
	if exists("/sys/fs/cgroup/cgroup.controllers") || exists("/sys/fs/cgroup/unified/cgroup.controllers") {
		versions = append(versions, CgroupV2)
	}
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	for _, v := range versions {
		t.Run(v.String(), func(t *testing.T) {
			r := Reader{CgroupVersion: v}
			m, err := r.Memory()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", m)
			if m.Available <= 0 || m.Available > m.Capacity {
				t.Errorf("memory.available = %d; want in (0, %d]", m.Available, m.Capacity)
			}
			sigs, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			// memory.available and pid.available first (sorted), then this kernel's PSI signals.
			if len(sigs) < 2 || sigs[0].Name != MemoryAvailable || sigs[1].Name != PIDAvailable {
				t.Fatalf("Read() = %v; want memory.available, pid.available, psi.*", sigs)
			}
			for _, s := range sigs[2:] {
				if !strings.HasPrefix(s.Name, "psi.") {
					t.Fatalf("unexpected signal %v", s)
				}
			}
			if p := sigs[1]; p.Available <= 0 || p.Available > p.Capacity {
				t.Errorf("pid.available = %v; want in (0, capacity]", p)
			}
		})
	}
}

func TestParseCgroupVersion(t *testing.T) {
	for in, want := range map[string]CgroupVersion{"auto": CgroupAuto, "1": CgroupV1, "2": CgroupV2} {
		if got, err := ParseCgroupVersion(in); err != nil || got != want {
			t.Errorf("ParseCgroupVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"3", "v3", "cgroup2", " 1"} {
		if _, err := ParseCgroupVersion(in); err == nil {
			t.Errorf("ParseCgroupVersion(%q): no error", in)
		}
	}
}

// TestAllocatableMemory: kubelet's allocatableMemory.available from the pods cgroup: limit -
// (usage - inactive_file), capacity = limit; absent cgroups give no observation. The v1 case uses a
// real memory cgroup of this host when the test may create one.
func TestAllocatableMemory(t *testing.T) {
	r := Reader{CgroupRoot: "testdata/v2", ProcRoot: "testdata/proc"}
	avail, capacity, ok, err := r.AllocatableMemory([]string{"kubepods.slice", "kubepods"})
	if err != nil || !ok || avail != 4*gi-(2*gi-512*mi) || capacity != 4*gi {
		t.Errorf("v2 = %d, %d, %v, %v; want %d, %d", avail, capacity, ok, err, 4*gi-(2*gi-512*mi), 4*gi)
	}
	if _, _, ok, err := r.AllocatableMemory([]string{"nope.slice"}); ok || err != nil {
		t.Errorf("absent cgroup: ok=%v err=%v; want no observation", ok, err)
	}
	sigs, err := Reader{CgroupRoot: "testdata/v2", ProcRoot: "testdata/proc", PodsCgroups: DefaultPodsCgroups}.Read()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range sigs {
		found = found || (s.Name == AllocatableMemoryAvailable && s.Capacity == 4*gi)
	}
	if !found {
		t.Errorf("Read() = %v; want %s", sigs, AllocatableMemoryAvailable)
	}

	host := Reader{}
	if v, _, err := host.Detect(); err != nil || v != CgroupV1 {
		t.Skipf("host cgroup memory is not v1 (%v, %v)", v, err)
	}
	name := fmt.Sprintf("nf-pressure-test-%d", os.Getpid())
	dir := filepath.Join(DefaultCgroupRoot, "memory", name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a memory cgroup: %v", err)
	}
	defer os.Remove(dir)
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte("536870912"), 0o644); err != nil {
		t.Fatal(err)
	}
	avail, capacity, ok, err = host.AllocatableMemory([]string{name})
	if err != nil || !ok || capacity != 512*mi || avail != 512*mi {
		t.Errorf("real v1 cgroup = %d, %d, %v, %v; want 512Mi available of 512Mi", avail, capacity, ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte("-1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := host.AllocatableMemory([]string{name}); ok || err != nil {
		t.Errorf("unlimited real cgroup: ok=%v err=%v; want no observation", ok, err)
	}
}

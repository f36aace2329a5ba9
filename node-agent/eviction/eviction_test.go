package eviction

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseQuantity(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "100Mi", want: 100 << 20},
		{in: "1Gi", want: 1 << 30},
		{in: "1.5Gi", want: 3 << 29},
		{in: "1G", want: 1e9},
		{in: "2k", want: 2000},
		{in: "1e3", want: 1000},
		{in: "1E3", want: 1000},
		{in: "12", want: 12},
		{in: "500m", want: 1}, // rounds up
		{in: ".5", want: 1},
		{in: "-1Ki", want: -1024},
		{in: "0", want: 0},
		{in: "8Ei", wantErr: true}, // overflows int64
		{in: "", wantErr: true},
		{in: "Mi", wantErr: true},
		{in: "1MB", wantErr: true},
		{in: "1 Mi", wantErr: true},
		{in: "1.2.3", wantErr: true},
		{in: "1e", wantErr: true},
		{in: "1e1000", wantErr: true},
		{in: "1ki", wantErr: true},
		{in: "+-1", wantErr: true},
		{in: "10%", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseQuantity(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseQuantity(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParse(t *testing.T) {
	f := Flags{
		Hard: "memory.available<500Mi,nodefs.available<10%,imagefs.available<0%", HardSet: true,
		Soft:                     "memory.available<1.5Gi,nodefs.inodesFree<15%",
		SoftGracePeriod:          "memory.available=1m30s,nodefs.inodesFree=2m",
		MinimumReclaim:           "memory.available=0Mi,nodefs.available=500Mi",
		PressureTransitionPeriod: 5 * time.Minute, MaxPodGracePeriod: 30,
	}
	got, errs := Parse(f)
	if len(errs) > 0 {
		t.Fatalf("Parse: %v", errs)
	}
	want := Config{
		Hard: []Threshold{
			{Signal: "memory.available", Value: Value{Quantity: 500 << 20}},
			{Signal: "nodefs.available", Value: Value{Percent: 10, IsPercent: true}, MinReclaim: Value{Quantity: 500 << 20}},
		},
		Soft: []Threshold{
			{Signal: "memory.available", Value: Value{Quantity: 3 << 29}, GracePeriod: 90 * time.Second},
			{Signal: "nodefs.inodesFree", Value: Value{Percent: 15, IsPercent: true}, GracePeriod: 2 * time.Minute},
		},
		PressureTransitionPeriod: 5 * time.Minute, MaxPodGracePeriod: 30 * time.Second,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}

	def, errs := Parse(Flags{})
	if len(errs) > 0 || len(def.Hard) != 5 || def.Hard[0].Signal != "imagefs.available" {
		t.Errorf("defaults: %v, %v", def.Hard, errs)
	}
	if none, errs := Parse(Flags{HardSet: true}); len(errs) > 0 || len(none.Hard) != 0 {
		t.Errorf("--eviction-hard=\"\": %v, %v; want no thresholds", none.Hard, errs)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		f    Flags
		want []string // every error, in order, by substring
	}{
		{name: "unknown signal", f: Flags{Hard: "memory.free<1Gi", HardSet: true}, want: []string{"unknown signal"}},
		{name: "wrong operator", f: Flags{Hard: "memory.available>1Gi", HardSet: true}, want: []string{"want signal<value"}},
		{name: "no value", f: Flags{Hard: "memory.available<", HardSet: true}, want: []string{"want signal<value"}},
		{name: "zero quantity", f: Flags{Hard: "memory.available<0", HardSet: true}, want: []string{"must be positive"}},
		{name: "negative quantity", f: Flags{Hard: "memory.available<-1Mi", HardSet: true}, want: []string{"must be positive"}},
		{name: "percent over 100", f: Flags{Hard: "nodefs.available<101%", HardSet: true}, want: []string{"within"}},
		{name: "bad percent", f: Flags{Hard: "nodefs.available<x%", HardSet: true}, want: []string{"bad percentage"}},
		{name: "0% minimum reclaim", f: Flags{MinimumReclaim: "memory.available=0%"}, want: []string{"must be positive"}},
		{name: "negative percentage", f: Flags{Hard: "memory.available<-15%", HardSet: true}, want: []string{"within"}},
		{name: "empty value", f: Flags{Hard: "memory.available<", HardSet: true}, want: []string{"want signal<value"}},
		{name: "blank statement", f: Flags{Hard: "memory.available<1Mi, ", HardSet: true}, want: []string{"want signal<value"}},
		{name: "bad float percentage", f: Flags{Hard: "memory.available<10..5%", HardSet: true}, want: []string{"bad percentage"}},
		{name: "grace of an unknown signal", f: Flags{Soft: "memory.available<1Gi", SoftGracePeriod: "memory.available=30s,mem.available=30s"}, want: []string{"unknown signal"}},
		{name: "reclaim of an unknown signal", f: Flags{MinimumReclaim: "mem.available=1Mi"}, want: []string{"unknown signal"}},
		{name: "reclaim empty value", f: Flags{MinimumReclaim: "memory.available="}, want: []string{"want signal=value"}},
		{name: "soft without grace", f: Flags{Soft: "memory.available<1Gi"}, want: []string{"grace period must be set"}},
		{name: "bad grace", f: Flags{Soft: "memory.available<1Gi", SoftGracePeriod: "memory.available=soon"}, want: []string{"invalid duration"}},
		{name: "negative grace", f: Flags{Soft: "memory.available<1Gi", SoftGracePeriod: "memory.available=-1s"}, want: []string{"must be positive"}},
		{name: "negative reclaim", f: Flags{MinimumReclaim: "memory.available=-1Mi"}, want: []string{"must be positive"}},
		{name: "negative transition", f: Flags{PressureTransitionPeriod: -time.Second}, want: []string{"--eviction-pressure-transition-period"}},
		{name: "every error at once", f: Flags{
			Hard: "a<1", HardSet: true, Soft: "memory.available<1Gi", SoftGracePeriod: "b=1s", MinimumReclaim: "memory.available=1MB",
		}, want: []string{"--eviction-hard", "--eviction-soft-grace-period", "--eviction-soft: memory.available", "--eviction-minimum-reclaim"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs := Parse(tt.f)
			if len(errs) != len(tt.want) {
				t.Fatalf("errors %v; want %d", errs, len(tt.want))
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tt.want[i]) {
					t.Errorf("error %d %q does not contain %q", i, e, tt.want[i])
				}
			}
		})
	}
}

func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"100Mi", "1.5G", "1e3", "500m", "-1", "8Ei", "1e999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseQuantity(s)
	})
}

func FuzzParse(f *testing.F) {
	f.Add("memory.available<100Mi,nodefs.available<10%", "memory.available<1Gi", "memory.available=1m", "memory.available=5%")
	f.Fuzz(func(t *testing.T, hard, soft, grace, reclaim string) {
		cfg, errs := Parse(Flags{Hard: hard, HardSet: true, Soft: soft, SoftGracePeriod: grace, MinimumReclaim: reclaim})
		if len(errs) == 0 {
			for _, th := range cfg.Soft {
				if th.GracePeriod < 0 {
					t.Fatalf("negative grace period accepted: %+v", th)
				}
			}
		}
	})
}

// TestParseKubeletSyntax is kubelet's flag syntax (component-base's map flags and
// ParseThresholdConfig): empty statements skipped, spaces trimmed, a repeated signal takes its
// later value (repeated flags are joined with ","), 0% and 100% disable a threshold, percentages
// read with 32-bit precision, a hard memory.available copied to allocatableMemory.available.
func TestParseKubeletSyntax(t *testing.T) {
	q := func(s string, v int64) Threshold { return Threshold{Signal: s, Value: Value{Quantity: v}} }
	tests := []struct {
		name string
		f    Flags
		hard []Threshold
		soft []Threshold
	}{
		{"trailing comma", Flags{HardSet: true, Hard: "memory.available<100Mi,"}, []Threshold{q(SignalMemoryAvailable, 100<<20)}, nil},
		{"spaces around <", Flags{HardSet: true, Hard: " memory.available < 100Mi , nodefs.available<10%"},
			[]Threshold{q(SignalMemoryAvailable, 100<<20), {Signal: SignalNodeFSAvailable, Value: Value{Percent: 10, IsPercent: true}}}, nil},
		{"repeated flag accumulates, later wins", Flags{HardSet: true, Hard: "memory.available<100Mi,pid.available<100" + "," + "memory.available<200Mi"},
			[]Threshold{q(SignalMemoryAvailable, 200<<20), q(SignalPIDAvailable, 100)}, nil},
		{"disable via 0% and 100%", Flags{HardSet: true, Hard: "memory.available<0%", Soft: "memory.available<100%", SoftGracePeriod: "memory.available=30s"}, nil, nil},
		{"allocatable copy of hard memory", Flags{HardSet: true, Hard: "memory.available<150Mi", MinimumReclaim: "memory.available=0", AllocatableMemory: true,
			Soft: "memory.available<300Mi", SoftGracePeriod: "memory.available=30s"},
			[]Threshold{q(SignalAllocatableMemoryAvailable, 150<<20), q(SignalMemoryAvailable, 150<<20)},
			[]Threshold{{Signal: SignalMemoryAvailable, Value: Value{Quantity: 300 << 20}, GracePeriod: 30 * time.Second}}},
		{"all disk values in percentages", Flags{HardSet: true, Hard: "imagefs.available<15%,nodefs.available<10.5%"},
			[]Threshold{{Signal: SignalImageFSAvailable, Value: Value{Percent: 15, IsPercent: true}},
				{Signal: SignalNodeFSAvailable, Value: Value{Percent: float64(float32(10.5)), IsPercent: true}}}, nil},
		{"0 quantity reclaim accepted", Flags{HardSet: true, Hard: "memory.available<1Gi", MinimumReclaim: "memory.available=0Mi"}, []Threshold{q(SignalMemoryAvailable, 1<<30)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := Parse(tt.f)
			if len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			if diff := cmp.Diff(tt.hard, got.Hard); diff != "" {
				t.Errorf("hard (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.soft, got.Soft); diff != "" {
				t.Errorf("soft (-want +got):\n%s", diff)
			}
		})
	}
}

package shutdown

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

func pod(name string, prio int32) eviction.Pod {
	return eviction.Pod{Namespace: "ns", Name: name, Priority: prio}
}

type phaseSummary struct {
	Priority int32
	Grace    time.Duration
	Pods     []string
}

func summarize(phases []Phase) []phaseSummary {
	var out []phaseSummary
	for _, ph := range phases {
		s := phaseSummary{Priority: ph.Priority, Grace: ph.GracePeriod}
		for _, p := range ph.Pods {
			s.Pods = append(s.Pods, p.Name)
		}
		out = append(out, s)
	}
	return out
}

// The seed's custom classes: custom-class-a 100000, -b 10000, -c 1000, regular 0.
var seedPods = []eviction.Pod{pod("a", 100000), pod("b", 10000), pod("c", 1000), pod("regular", 0), pod("b2", 50000), pod("negative", -10)}

func TestPlan(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		pods []eviction.Pod
		want []phaseSummary
	}{
		{
			name: "two phases: 30s total, 10s critical (seed): regular pods get 20s, critical the last 10s",
			cfg:  Config{GracePeriod: 30 * time.Second, CriticalGracePeriod: 10 * time.Second},
			pods: []eviction.Pod{pod("web", 0), pod("dns", SystemCriticalPriority), pod("node-critical", SystemCriticalPriority+1000), pod("batch", 1000)},
			want: []phaseSummary{
				{0, 20 * time.Second, []string{"batch", "web"}},
				{SystemCriticalPriority, 10 * time.Second, []string{"dns", "node-critical"}},
			},
		},
		{
			name: "seed table 1: four ranges",
			cfg: Config{ByPriority: []PriorityGrace{
				{100000, 10 * time.Second}, {10000, 180 * time.Second}, {1000, 120 * time.Second}, {0, 60 * time.Second}}},
			pods: seedPods,
			want: []phaseSummary{
				{0, 60 * time.Second, []string{"negative", "regular"}}, // below every range: the lowest
				{1000, 120 * time.Second, []string{"c"}},
				{10000, 180 * time.Second, []string{"b", "b2"}},
				{100000, 10 * time.Second, []string{"a"}},
			},
		},
		{
			name: "seed table 2: classes b and c share the 1000 range",
			cfg:  Config{ByPriority: []PriorityGrace{{100000, 300 * time.Second}, {1000, 120 * time.Second}, {0, 60 * time.Second}}},
			pods: seedPods,
			want: []phaseSummary{
				{0, 60 * time.Second, []string{"negative", "regular"}},
				{1000, 120 * time.Second, []string{"b", "b2", "c"}},
				{100000, 300 * time.Second, []string{"a"}},
			},
		},
		{
			name: "empty ranges are planned with no pods (skipped at once)",
			cfg: Config{ByPriority: []PriorityGrace{
				{100000, 10 * time.Second}, {10000, 180 * time.Second}, {1000, 120 * time.Second}, {0, 60 * time.Second}}},
			pods: []eviction.Pod{pod("a", 100000), pod("regular", 0)},
			want: []phaseSummary{
				{0, 60 * time.Second, []string{"regular"}},
				{1000, 120 * time.Second, nil},
				{10000, 180 * time.Second, nil},
				{100000, 10 * time.Second, []string{"a"}},
			},
		},
		{name: "off", cfg: Config{}, pods: seedPods, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, summarize(Plan(tt.cfg, tt.pods))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseByPriority(t *testing.T) {
	got, err := ParseByPriority("100000:10s, 10000:3m,1000:120s,0:60s")
	if err != nil {
		t.Fatal(err)
	}
	want := []PriorityGrace{{100000, 10 * time.Second}, {10000, 3 * time.Minute}, {1000, 2 * time.Minute}, {0, time.Minute}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if s := FormatByPriority(got); s != "100000:10s,10000:3m0s,1000:2m0s,0:1m0s" {
		t.Errorf("FormatByPriority = %q", s)
	}
	for _, bad := range []struct{ in, want string }{
		{"100000", "want priority:duration"},
		{"x:10s", "not a 32-bit integer"},
		{"3000000000:10s", "not a 32-bit integer"},
		{"0:ten", "invalid duration"},
		{"0:-1s", "must not be negative"},
		{"0:1s,0:2s", "given twice"},
		{"0:1s,", "want priority:duration"},
	} {
		_, err := ParseByPriority(bad.in)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseByPriority(%q) = %v, want an error containing %q", bad.in, err, bad.want)
		}
	}
}

func FuzzParseByPriority(f *testing.F) {
	f.Add("100000:10s,0:60s")
	f.Add("-5:1m,")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseByPriority(s)
		if err != nil {
			return
		}
		again, err := ParseByPriority(FormatByPriority(got))
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("round trip of %q: %v -> %v, %v", s, got, again, err)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want []string
	}{
		{Config{GracePeriod: 30 * time.Second, CriticalGracePeriod: 10 * time.Second}, nil},
		{Config{GracePeriod: 10 * time.Second, CriticalGracePeriod: 30 * time.Second}, []string{"must not exceed"}},
		{Config{GracePeriod: -1}, []string{"--shutdown-grace-period: -1ns must not be negative"}},
		{Config{GracePeriod: time.Second, ByPriority: []PriorityGrace{{0, time.Second}}}, []string{"cannot be combined"}},
	}
	for _, tt := range tests {
		errs := tt.cfg.Validate()
		if len(errs) != len(tt.want) {
			t.Errorf("Validate(%+v) = %v, want %d errors", tt.cfg, errs, len(tt.want))
			continue
		}
		for i, e := range errs {
			if !strings.Contains(e.Error(), tt.want[i]) {
				t.Errorf("Validate(%+v)[%d] = %v, want %q", tt.cfg, i, e, tt.want[i])
			}
		}
	}
	if (Config{}).Enabled() {
		t.Error("both grace periods 0 must mean off")
	}
}

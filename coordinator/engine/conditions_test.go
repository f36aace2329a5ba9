package engine

import (
	"strings"
	"testing"
	"time"
)

func TestParseConditionTrigger(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ConditionTrigger
		err  string
	}{
		{"KernelDeadlock=True:5m", ConditionTrigger{"KernelDeadlock", "True", 5 * time.Minute}, ""},
		{"ReadonlyFilesystem=Unknown:30s", ConditionTrigger{"ReadonlyFilesystem", "Unknown", 30 * time.Second}, ""},
		{"KernelDeadlock=True", ConditionTrigger{}, "TYPE=STATUS:DURATION"},
		{"=True:5m", ConditionTrigger{}, "condition type"},
		{"Ready=False:1m", ConditionTrigger{}, "kube-controller-manager"},
		{"MemoryPressure=True:1m", ConditionTrigger{}, "not a trigger"},
		{"KernelDeadlock=yes:1m", ConditionTrigger{}, "True, False or Unknown"},
		{"KernelDeadlock=True:0s", ConditionTrigger{}, "positive"},
		{"KernelDeadlock=True:-1m", ConditionTrigger{}, "positive"},
		{"Kernel Deadlock=True:1m", ConditionTrigger{}, "condition type"},
	} {
		got, err := ParseConditionTrigger(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.err)
		}
	}
	if err := ValidateConditionTriggers([]ConditionTrigger{{"A", "True", time.Second}, {"A", "False", time.Second}}); err == nil {
		t.Error("one condition type given twice: accepted")
	}
}

func FuzzParseConditionTrigger(f *testing.F) {
	for _, s := range []string{"KernelDeadlock=True:5m", "a=b:c", "=:", "Ready=True:1s", "x=True:1h2m3s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConditionTrigger(s)
		if err != nil {
			return
		}
		if c.For <= 0 || c.Type == "" || notTriggers[c.Type] {
			t.Fatalf("%q parsed to %+v", s, c)
		}
		if back, err := ParseConditionTrigger(c.String()); err != nil || back != c {
			t.Fatalf("%q: %+v does not round-trip through %q: %+v %v", s, c, c.String(), back, err)
		}
	})
}

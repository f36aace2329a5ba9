package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ten := []float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}
	tests := []struct {
		v    []float64
		p    float64
		want float64
	}{
		{nil, 50, 0},
		{[]float64{42.04}, 99, 42},
		{ten, 50, 5},
		{ten, 90, 9},
		{ten, 99, 10},
		{ten, 100, 10},
		{[]float64{3, 1, 2}, 50, 2},
	}
	for _, tt := range tests {
		if got := percentile(tt.v, tt.p); got != tt.want {
			t.Errorf("percentile(%v, %v) = %v; want %v", tt.v, tt.p, got, tt.want)
		}
	}
	if ten[0] != 10 {
		t.Error("percentile sorted its input")
	}
}

func TestParseHogLog(t *testing.T) {
	log := "start 1700000000000000000\n" +
		"step 1 8388608 1700000000000500000 1700000000001000000 500000000\n" +
		"step 2 16777216 1700000000051000000 1700000000052000000 430000000\n" +
		"step 3 25165824 1700000000102000000 1700000000103000000 419430399\n" +
		"hold 1700000000104000000\n" +
		"step 4 3355" // cut by the kill: ignored
	h, err := parseHogLog([]byte(log))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Steps) != 3 || h.Hold.IsZero() || h.Start != time.Unix(0, 1700000000000000000) {
		t.Fatalf("parsed %+v", h)
	}
	s, ok := h.crossing(400 << 20)
	if !ok || s.N != 3 || s.Begin != time.Unix(0, 1700000000102000000) || s.Allocated != 3*8<<20 {
		t.Errorf("crossing of 400Mi = %+v, %v; want step 3", s, ok)
	}
	if _, ok := h.crossing(400 << 10); ok {
		t.Error("crossing of 400Ki found; want none")
	}

	for _, bad := range []string{
		"",
		"step 1 8388608 1 2 5\n",          // no start
		"start 1\nstep 2 8388608 1 2 5\n", // out of order
		"start 1\nstep 1 -8 1 2 5\n",      // negative allocation
		"start 1\nstep 1 8 1 2 -2\n",      // bad available
		"start 1\nstep 1 8 1 17000000000010000x0 5\n", // bad time
		"start 1\nstep 1 8 3 2 5\n",                   // ends before it begins
		"start 1\nstep 1 8 2 5\n",                     // a field short
		"start 1\nmmap: Cannot allocate memory\n",     // unknown line
		"start x\n", // bad start
		"start 1\n" + strings.Repeat("hold 1\n", maxHogLog/len("hold 1\n")+1), // too long
	} {
		if _, err := parseHogLog([]byte(bad)); err == nil {
			t.Errorf("parseHogLog(%.60q) = nil error; want one", bad)
		}
	}
}

func FuzzParseHogLog(f *testing.F) {
	f.Add([]byte("start 1\nstep 1 8 2 3 4\nhold 5\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseHogLog(data)
		if err != nil {
			return
		}
		for i, s := range h.Steps {
			if s.N != i+1 || s.Allocated <= 0 || s.Available < -1 || s.End.Before(s.Begin) {
				t.Fatalf("accepted step %+v", s)
			}
		}
	})
}

// TestResultLine: the last line is one JSON object whose first fields are the issue's, in order.
func TestResultLine(t *testing.T) {
	r := &result{Bench: "pressure", Rounds: 3, NodefenceEach: []float64{40, 50, 45}, KubeletEach: []float64{5000, 9000, 7000}}
	r.summarize()
	line := r.line()
	if strings.Contains(line, "\n") {
		t.Fatalf("line has a newline: %q", line)
	}
	want := `{"bench":"pressure","rounds":3,"nodefence_p50_ms":45,"nodefence_p99_ms":50,"kubelet_p50_ms":7000,"kubelet_p99_ms":9000,"ratio":155.56,`
	if !strings.HasPrefix(line, want) {
		t.Errorf("line\n%s\nwant prefix\n%s", line, want)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil || m["goal_met"] != true {
		t.Errorf("line %s: %v, goal_met %v; want valid JSON, goal met", line, err, m["goal_met"])
	}
	slow := &result{Bench: "pressure", Rounds: 2, NodefenceEach: []float64{40, 250}, KubeletEach: []float64{5000, 9000}}
	slow.summarize()
	if slow.GoalMet {
		t.Errorf("goal met with a p99 of %v ms", slow.NodefenceP99)
	}
}

func TestOptionsValidate(t *testing.T) {
	ok := options{rounds: 10, threshold: "400Mi", podsLimit: 768, hog: 448, step: 8, stepPause: 50 * time.Millisecond, wait: 40 * time.Second, budget: 9 * time.Minute}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*options){
		"hog above 512 MiB":          func(o *options) { o.hog = 600; o.podsLimit = 1024 },
		"hog never crosses":          func(o *options) { o.hog = 300 },
		"hog too close to the limit": func(o *options) { o.podsLimit = 480 },
		"bad threshold":              func(o *options) { o.threshold = "lots" },
		"no rounds":                  func(o *options) { o.rounds = 0 },
		"budget over 10 minutes":     func(o *options) { o.budget = time.Hour },
	} {
		o := ok
		mod(&o)
		if err := o.validate(); err == nil {
			t.Errorf("%s: validate() = nil; want an error", name)
		}
	}
}

// TestHog builds the hog (gcc, as the bench does) and runs it on a cgroup directory of files: its
// log parses, and available is limit - (usage - total_inactive_file).
func TestHog(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed (make deps)")
	}
	dir := t.TempDir()
	if err := buildHog(dir); err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(dir, "kubepods")
	for name, data := range map[string]string{"memory.usage_in_bytes": "300000000\n", "memory.limit_in_bytes": "805306368\n",
		"memory.stat": "cache 5\ntotal_cache 7\ntotal_inactive_file 100000000\n", "go": ""} {
		if err := os.MkdirAll(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cg, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "hog"), "1048576", "3145728", "1000", filepath.Join(cg, "go"), cg)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), "hold") {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("hog output %q: %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	h, err := parseHogLog(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Steps) != 3 || h.Steps[2].Allocated != 3<<20 || h.Steps[0].Available != 805306368-200000000 || h.Hold.Before(h.Steps[2].End) || h.Steps[0].End.Before(h.Steps[0].Begin) {
		t.Errorf("hog log %q parsed as %+v", got, h)
	}
}

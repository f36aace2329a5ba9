package main

import (
	"encoding/json"
	"math"
	"sort"
)

// result is the last line of output. The first fields are the contract of the issue; the rest
// describe the run.
type result struct {
	Bench          string    `json:"bench"`
	Rounds         int       `json:"rounds"`
	NodefenceP50   float64   `json:"nodefence_p50_ms"`
	NodefenceP99   float64   `json:"nodefence_p99_ms"`
	KubeletP50     float64   `json:"kubelet_p50_ms"`
	KubeletP99     float64   `json:"kubelet_p99_ms"`
	Ratio          float64   `json:"ratio"`
	GoalMet        bool      `json:"goal_met"`
	Node           string    `json:"node"`
	Threshold      string    `json:"threshold"`
	AllocatableMiB int64     `json:"pods_cgroup_limit_mib"`
	HogMiB         int64     `json:"hog_mib"`
	StepMiB        int64     `json:"hog_step_mib"`
	StepPauseMs    float64   `json:"hog_step_pause_ms"`
	JitterS        float64   `json:"start_jitter_s"`
	FastInterval   string    `json:"agent_memory_fast_interval"`
	NodefenceEach  []float64 `json:"nodefence_each_ms"`
	KubeletEach    []float64 `json:"kubelet_each_ms"`
	NodefenceRerun int       `json:"nodefence_rerun"`
	KubeletRerun   int       `json:"kubelet_rerun"`
}

// percentile is the nearest-rank percentile p (0 < p <= 100) of v, rounded to 0.1; 0 for no
// values.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	i = min(max(i, 0), len(s)-1)
	return round1(s[i])
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }

// summarize fills the percentiles, the ratio and the goal: nodefence at least 10 times faster than
// kubelet at p50, and its p99 at most 200 ms.
func (r *result) summarize() {
	r.NodefenceP50, r.NodefenceP99 = percentile(r.NodefenceEach, 50), percentile(r.NodefenceEach, 99)
	r.KubeletP50, r.KubeletP99 = percentile(r.KubeletEach, 50), percentile(r.KubeletEach, 99)
	r.Ratio = 0
	if r.NodefenceP50 > 0 {
		r.Ratio = math.Round(r.KubeletP50/r.NodefenceP50*100) / 100
	}
	r.GoalMet = len(r.NodefenceEach) > 0 && len(r.KubeletEach) > 0 && r.Ratio >= 10 && r.NodefenceP99 <= 200
}

// line is the result as one JSON line.
func (r *result) line() string {
	b, err := json.Marshal(r)
	if err != nil {
		return `{"bench":"pressure","error":"` + err.Error() + `"}`
	}
	return string(b)
}

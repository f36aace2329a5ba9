package gctune

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	// Apply changes process-wide settings: put them back.
	prevGC, prevLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(prevGC); debug.SetMemoryLimit(prevLimit) })
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name      string
		env       map[string]string
		memoryMax string
		wantGOGC  int
		wantLimit int64
	}{
		{name: "limited container", memoryMax: write("limited", "536870912\n"), wantGOGC: 200, wantLimit: 483183820},
		{name: "unlimited container", memoryMax: write("unlimited", "max\n"), wantGOGC: 200},
		{name: "no cgroup file", memoryMax: filepath.Join(dir, "missing"), wantGOGC: 200},
		{name: "unreadable value", memoryMax: write("garbage", "lots\n"), wantGOGC: 200},
		{name: "GOGC wins", env: map[string]string{"GOGC": "150"}, memoryMax: write("limited2", "1073741824"), wantGOGC: 150, wantLimit: 966367641},
		{name: "GOMEMLIMIT wins", env: map[string]string{"GOMEMLIMIT": "300MiB"}, memoryMax: write("limited3", "1073741824"), wantGOGC: 200, wantLimit: 300 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			// The runtime reads the environment only at start: set what it would have read.
			if v, ok := tt.env["GOGC"]; ok && v == "150" {
				debug.SetGCPercent(150)
			}
			if _, ok := tt.env["GOMEMLIMIT"]; ok {
				debug.SetMemoryLimit(300 << 20)
			}
			gogc, limit := Apply(200, tt.memoryMax)
			if gogc != tt.wantGOGC || limit != tt.wantLimit {
				t.Errorf("Apply = %d, %d; want %d, %d", gogc, limit, tt.wantGOGC, tt.wantLimit)
			}
			if got := debug.SetGCPercent(-1); got != tt.wantGOGC {
				t.Errorf("GOGC in force %d, want %d", got, tt.wantGOGC)
			}
			wantInForce := tt.wantLimit
			if wantInForce == 0 {
				wantInForce = math.MaxInt64
			}
			if got := debug.SetMemoryLimit(-1); got != wantInForce {
				t.Errorf("memory limit in force %d, want %d", got, wantInForce)
			}
		})
	}
}

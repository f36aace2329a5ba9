// Package gctune sets a long-running binary's garbage-collection target and, in a container, a soft
// memory limit below the container's, so that a target above Go's default stays inside it.
package gctune

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// CgroupMemoryMax is where a process in a cgroup v2 container reads its memory limit.
const CgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// memoryLimitShare is the part of the container's memory limit the Go runtime aims to stay under;
// the rest is for memory it does not manage and for the collector's lag.
const memoryLimitShare = 0.9

// Apply sets the process's garbage-collection target to percent (Go's GOGC; the GOGC environment
// variable wins when set) and, unless GOMEMLIMIT is set, a soft memory limit of 90% of the memory
// limit in cgroupMemoryMax (CgroupMemoryMax in production; "max" or a missing file means none), so
// that a target above Go's default never takes the process past its container's limit: near the
// limit the collector runs more often instead. It returns the target and limit in force (limit 0:
// none), for the log.
func Apply(percent int, cgroupMemoryMax string) (gogc int, limit int64) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(sample)
		gogc = int(sample[0].Value.Uint64())
	} else {
		debug.SetGCPercent(percent)
		gogc = percent
	}
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		limit = debug.SetMemoryLimit(-1)
		return gogc, limit
	}
	if b, err := os.ReadFile(cgroupMemoryMax); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
			limit = int64(float64(n) * memoryLimitShare)
			debug.SetMemoryLimit(limit)
		}
	}
	return gogc, limit
}

package signals

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseMemoryStat parses a cgroup memory.stat file (v1 or v2): one "key value" pair per line, the
// value a decimal unsigned integer. It is strict: a line with the wrong number of fields, a value that
// is not a uint64, a duplicate key or an empty file is an error, because a silently misread
// inactive_file turns into a wrong memory.available.
func ParseMemoryStat(data []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	for n, line := range lines(data) {
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("memory.stat line %d: want \"key value\", got %q", n+1, line)
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("memory.stat line %d: key %q: %w", n+1, fields[0], err)
		}
		if _, dup := out[fields[0]]; dup {
			return nil, fmt.Errorf("memory.stat line %d: duplicate key %q", n+1, fields[0])
		}
		out[fields[0]] = v
	}
	if len(out) == 0 {
		return nil, errors.New("memory.stat: empty")
	}
	return out, nil
}

// ParseMeminfo parses /proc/meminfo into a map of byte counts (values in "kB" are multiplied by
// 1024; unitless values such as HugePages_Total are kept as they are). Lines look like
// "MemTotal:       24684092 kB". Malformed lines, unknown units, overflow, duplicate keys and an empty
// file are errors.
func ParseMeminfo(data []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	for n, line := range lines(data) {
		key, rest, ok := strings.Cut(line, ":")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("meminfo line %d: want \"Key: value [kB]\", got %q", n+1, line)
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 || len(fields) > 2 {
			return nil, fmt.Errorf("meminfo line %d: want \"Key: value [kB]\", got %q", n+1, line)
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("meminfo line %d: %s: %w", n+1, key, err)
		}
		if len(fields) == 2 {
			if fields[1] != "kB" {
				return nil, fmt.Errorf("meminfo line %d: %s: unknown unit %q", n+1, key, fields[1])
			}
			if v > math.MaxUint64/1024 {
				return nil, fmt.Errorf("meminfo line %d: %s: %d kB overflows", n+1, key, v)
			}
			v *= 1024
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("meminfo line %d: duplicate key %q", n+1, key)
		}
		out[key] = v
	}
	if len(out) == 0 {
		return nil, errors.New("meminfo: empty")
	}
	return out, nil
}

// ParseUint parses a single-value kernel file such as memory.usage_in_bytes, memory.current or
// kernel/pid_max: one decimal unsigned integer, optionally followed by a newline. "max" and anything
// else are errors.
func ParseUint(data []byte) (uint64, error) {
	s := strings.TrimSuffix(string(data), "\n")
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want one unsigned integer: %w", err)
	}
	return v, nil
}

// ParseLoadavgTasks returns the number of tasks (processes and threads) that currently exist, from
// /proc/loadavg ("0.41 0.74 0.57 1/84 15201": the 84). Kubelet reads the same field for
// pid.available because sysinfo(2) truncates the count above 65535.
func ParseLoadavgTasks(data []byte) (int64, error) {
	fields := strings.Fields(string(data))
	if len(fields) != 5 {
		return 0, fmt.Errorf("loadavg: want 5 fields, got %d", len(fields))
	}
	running, total, ok := strings.Cut(fields[3], "/")
	if _, err := strconv.ParseUint(running, 10, 64); !ok || err != nil {
		return 0, fmt.Errorf("loadavg: want running/total in field 4, got %q", fields[3])
	}
	v, err := strconv.ParseInt(total, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("loadavg: bad task count %q", total)
	}
	return v, nil
}

// lines splits data into lines, allowing (only) one trailing newline.
func lines(data []byte) []string {
	data = bytes.TrimSuffix(data, []byte("\n"))
	if len(data) == 0 {
		return nil
	}
	return strings.Split(string(data), "\n")
}

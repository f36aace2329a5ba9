package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// hogSource is the memory hog. It waits for the file argv[4] to exist, then maps and touches
// anonymous memory in steps of argv[1] bytes, argv[3] microseconds apart, until argv[2] bytes,
// and holds it. After each step it reads the pods' cgroup (argv[5], the kubelet's kubepods memory
// cgroup mounted read-only) and logs, line-buffered to stdout:
//
//	start <unix ns>
//	step <i> <bytes allocated> <unix ns before the step> <unix ns after> <allocatableMemory.available, -1 unread>
//	hold <unix ns>
//
// allocatableMemory.available is computed as kubelet does: memory.limit_in_bytes -
// (memory.usage_in_bytes - total_inactive_file), at least 0.
const hogSource = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long read_num(const char *dir, const char *file) {
	char path[512];
	long long v = -1;
	snprintf(path, sizeof path, "%s/%s", dir, file);
	FILE *f = fopen(path, "r");
	if (!f) return -1;
	if (fscanf(f, "%lld", &v) != 1) v = -1;
	fclose(f);
	return v;
}

static long long read_stat(const char *dir, const char *key) {
	char path[512], name[128];
	long long v, out = -1;
	snprintf(path, sizeof path, "%s/memory.stat", dir);
	FILE *f = fopen(path, "r");
	if (!f) return -1;
	while (fscanf(f, "%127s %lld", name, &v) == 2) {
		if (strcmp(name, key) == 0) { out = v; break; }
	}
	fclose(f);
	return out;
}

static long long available(const char *dir) {
	long long usage = read_num(dir, "memory.usage_in_bytes");
	long long limit = read_num(dir, "memory.limit_in_bytes");
	long long inactive = read_stat(dir, "total_inactive_file");
	if (usage < 0 || limit < 0 || inactive < 0) return -1;
	long long ws = usage > inactive ? usage - inactive : 0;
	return limit > ws ? limit - ws : 0;
}

int main(int argc, char **argv) {
	if (argc != 6) {
		fprintf(stderr, "usage: hog STEP_BYTES TARGET_BYTES PAUSE_US GO_FILE KUBEPODS_DIR\n");
		return 2;
	}
	long step = atol(argv[1]), target = atol(argv[2]), pause_us = atol(argv[3]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (access(argv[4], F_OK) != 0) usleep(5000);
	printf("start %lld\n", now_ns());
	long total = 0;
	for (int i = 1; total < target; i++) {
		long long begin = now_ns();
		char *p = mmap(NULL, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED) { perror("mmap"); return 1; }
		memset(p, 1, step);
		total += step;
		long long t = now_ns();
		printf("step %d %ld %lld %lld %lld\n", i, total, begin, t, available(argv[5]));
		usleep(pause_us);
	}
	printf("hold %lld\n", now_ns());
	for (;;) pause();
}
`

// buildHog compiles hogSource statically with gcc into dir/hog.
func buildHog(dir string) error {
	src, out := filepath.Join(dir, "hog.c"), filepath.Join(dir, "hog")
	if err := os.WriteFile(src, []byte(hogSource), 0o644); err != nil {
		return err
	}
	if msg, err := exec.Command("gcc", "-O2", "-static", "-o", out, src).CombinedOutput(); err != nil {
		return fmt.Errorf("gcc hog.c (Debian package gcc): %w: %s", err, msg)
	}
	return nil
}

// step is one line "step" of the hog's log.
type step struct {
	N         int
	Allocated int64
	// Begin and End are the times before and after the step's allocation.
	Begin, End time.Time
	// Available is allocatableMemory.available read right after the step; -1: not read.
	Available int64
}

// hogLog is a parsed hog log.
type hogLog struct {
	Start time.Time
	Steps []step
	Hold  time.Time // zero: the hog did not reach its target
}

// maxHogLog bounds the log read.
const maxHogLog = 1 << 20

// parseHogLog parses the hog's log; a last line without its newline (the hog killed mid-write)
// is ignored.
func parseHogLog(data []byte) (hogLog, error) {
	var h hogLog
	if len(data) > maxHogLog {
		return h, fmt.Errorf("hog log: %d bytes, more than %d", len(data), maxHogLog)
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	ns := func(s string) (time.Time, error) {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			return time.Time{}, fmt.Errorf("bad time %q", s)
		}
		return time.Unix(0, v), nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		var err error
		switch {
		case len(f) == 2 && f[0] == "start":
			h.Start, err = ns(f[1])
		case len(f) == 2 && f[0] == "hold":
			h.Hold, err = ns(f[1])
		case len(f) == 6 && f[0] == "step":
			var s step
			if s.N, err = strconv.Atoi(f[1]); err != nil || s.N != len(h.Steps)+1 {
				err = fmt.Errorf("step number %q out of order", f[1])
				break
			}
			if s.Allocated, err = strconv.ParseInt(f[2], 10, 64); err != nil || s.Allocated <= 0 {
				err = fmt.Errorf("bad allocation %q", f[2])
				break
			}
			if s.Begin, err = ns(f[3]); err != nil {
				break
			}
			if s.End, err = ns(f[4]); err != nil {
				break
			}
			if s.End.Before(s.Begin) {
				err = errors.New("step ends before it begins")
				break
			}
			if s.Available, err = strconv.ParseInt(f[5], 10, 64); err != nil || s.Available < -1 {
				err = fmt.Errorf("bad available %q", f[5])
				break
			}
			h.Steps = append(h.Steps, s)
		default:
			err = errors.New("unknown line")
		}
		if err != nil {
			return h, fmt.Errorf("hog log line %d %q: %w", line, sc.Text(), err)
		}
	}
	if h.Start.IsZero() {
		return h, errors.New("hog log: no start line")
	}
	return h, nil
}

// crossing is the first step after which allocatableMemory.available, as the hog read it, was
// below threshold bytes (kubelet's "LessThan"). The threshold was crossed during that step: its
// Begin is the crossing time the bench uses (an early bound: the latency measured includes the
// step). ok is false when no step got there.
func (h hogLog) crossing(threshold int64) (step, bool) {
	for _, s := range h.Steps {
		if s.Available >= 0 && s.Available < threshold {
			return s, true
		}
	}
	return step{}, false
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFirstRun starts the testbed as `make run` does (the built binary, its default run directory
// bin/run, ports from $NODEFENCE_TESTBED_PORT_BASE), runs every command of the README's tour and then
// of docs/testbed.md's "Calling it" as written there, crashes a node from the console through the tour, and then stops the testbed
// every way a user can: Ctrl-C, SIGTERM, SIGHUP, SIGKILL, Ctrl-C with stdout a closed pipe, Ctrl-C
// while starting. Each time no process it started may survive (checked by PID) and the run directory
// must be gone (after SIGKILL: cleared by the next start).
func TestFirstRun(t *testing.T) {
	for _, tool := range []string{"ipmi_sim", "bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (make deps): %v", tool, err)
		}
	}
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(repo, "bin", "tools", "grpcurl")); err != nil {
		t.Fatalf("grpcurl is not in bin/tools (make run-tools): %v", err)
	}
	// A checkout's layout: bin/ with the binaries and tools/, deploy/; the README's commands run here.
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./coordinator/cmd/coordinator", "./coordinator/cmd/fencectl",
		"./node-agent/cmd/node-agent", "./fence-drivers/cmd/fence-driver", "./testbed/cmd/nodefence-testbed")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, l := range [][2]string{{filepath.Join(repo, "bin", "tools"), filepath.Join(bin, "tools")}, {filepath.Join(repo, "deploy"), filepath.Join(root, "deploy")}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	base := freePortBlock(t, portSpan(3))
	// The testbed keeps SIGHUP ignored when it inherits it ignored (nohup), as this test may be run;
	// handled here, it reaches the testbed with its default.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	defer signal.Reset(syscall.SIGHUP)
	runDir := filepath.Join(bin, "run")

	t.Run("README", func(t *testing.T) {
		tb := startTestbed(t, bin, base, 3)
		runReadme(t, repo, root, runDir)
		tb.stopAndCheck(t, syscall.SIGINT, true)
	})
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			tb := startTestbed(t, bin, base, 1)
			tb.stopAndCheck(t, sig, sig != syscall.SIGKILL)
			if sig == syscall.SIGKILL {
				if _, err := os.Stat(filepath.Join(runDir, pidFile)); err != nil {
					t.Fatalf("after SIGKILL the run directory should be left for the next start to clear: %v", err)
				}
			}
		})
	}
	t.Run("a-child-dies", func(t *testing.T) {
		// The coordinator dies under the running testbed: it says so and stops the rest.
		tb := startTestbed(t, bin, base, 1)
		for pid, info := range tb.procs {
			if info.comm == "coordinator" {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		tb.waitFor(t, "coordinator (pid")
		tb.stopAndCheck(t, 0, false)
		if _, err := os.Stat(filepath.Join(runDir, "coordinator.log")); err != nil {
			t.Fatalf("the coordinator's log is not kept after it died: %v", err)
		}
	})
	t.Run("closed-pipe", func(t *testing.T) {
		// `make run | tee log`, Ctrl-C: tee is gone before the testbed writes "stopping".
		tb := startTestbed(t, bin, base, 1)
		tb.closeStdout()
		tb.stopAndCheck(t, syscall.SIGINT, true)
	})
	t.Run("ctrl-c-while-starting", func(t *testing.T) {
		tb := launchTestbed(t, bin, base, 1)
		tb.waitFor(t, "fence-driver (ipmi) listening")
		tb.collect()
		tb.stopAndCheck(t, syscall.SIGINT, false)
		if _, err := os.Stat(runDir); err == nil {
			t.Fatalf("run directory %s left after Ctrl-C while starting", runDir)
		}
	})
	t.Run("failure-while-starting", func(t *testing.T) {
		// The coordinator fails after the BMCs and the fence-driver are up: they must be stopped.
		broken := filepath.Join(root, "broken-bin")
		if err := os.Mkdir(broken, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range []string{"fence-driver", "node-agent", "fencectl"} {
			if err := os.Symlink(filepath.Join(bin, b), filepath.Join(broken, b)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(broken, "coordinator"), []byte("#!/bin/sh\necho cannot start >&2\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, "broken-run")
		cmd := exec.Command(filepath.Join(bin, "nodefence-testbed"), "--bin", broken, "--workdir", dir, "--simulated", "1", "run")
		cmd.Env = append(os.Environ(), portBaseEnv+"="+strconv.Itoa(base))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "coordinator exited before listening") {
			t.Fatalf("with a coordinator that cannot start: err %v, output:\n%s", err, out)
		}
		if !strings.Contains(string(out), "fence-driver (ipmi) listening") {
			t.Fatalf("the fence-driver was not started before the failure:\n%s", out)
		}
		if left := processesMentioning(dir); len(left) > 0 {
			for pid, cmdline := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("after the failed start pid %d is still running: %s", pid, cmdline)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "fence-driver.log")); err != nil {
			t.Errorf("after the failed start the logs are not kept: %v", err)
		}
	})
	t.Run("port-taken", func(t *testing.T) {
		l, err := net.Listen("tcp", loopback(base+1))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cmd := exec.Command(filepath.Join(bin, "nodefence-testbed"), "--simulated", "1", "run")
		cmd.Env = append(os.Environ(), portBaseEnv+"="+strconv.Itoa(base))
		out, err := cmd.CombinedOutput()
		want := fmt.Sprintf("port %d/tcp (fence-driver gRPC) is taken", base+1)
		if err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("with port %d taken: err %v, output:\n%s\nwant an error saying %q", base+1, err, out, want)
		}
	})
}

// The sections whose sh blocks TestFirstRun runs, in this order: the README's tour (which must stay
// a tour: at most tourMaxLines command lines), then the rest of the commands in docs/testbed.md.
const (
	tourSection     = "## A tour of `make run`"
	callingSection  = "## Calling it"
	tourMaxLines    = 10
	callingItMinLen = 5
)

// runReadme runs each command of the README's tour and then of docs/testbed.md's "Calling it", in
// root (a checkout's layout), each after the `. FILE` lines before it, and checks the tour sources the
// env file and crashes a node whose BMC then reads off.
func runReadme(t *testing.T, repo, root, runDir string) {
	tour := shLines(t, filepath.Join(repo, "README.md"), tourSection)
	if len(tour) > tourMaxLines {
		t.Errorf("the README's tour has %d command lines; a tour has at most %d (move the rest to docs/testbed.md)", len(tour), tourMaxLines)
	}
	more := shLines(t, filepath.Join(repo, "docs", "testbed.md"), callingSection)
	if len(more) < callingItMinLen {
		t.Fatalf("docs/testbed.md's Calling it has only %d command lines", len(more))
	}
	lines := append(tour, more...)
	// grpcurl must come from the env file's PATH, not from the caller's (make exports bin/tools).
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "grpcurl")); err != nil {
			path = append(path, dir)
		}
	}
	env := []string{"PATH=" + strings.Join(path, ":"), "HOME=" + os.Getenv("HOME")}
	var setup []string
	sourced, crashed := false, ""
	for i, line := range lines {
		if strings.HasPrefix(line, ". ") || strings.HasPrefix(line, "source ") {
			if !slices.Contains(setup, line) {
				setup = append(setup, line)
			}
			sourced = sourced || i < len(tour) && strings.Contains(line, "bin/run/env")
			continue
		}
		if m := regexp.MustCompile(`nodefence-testbed crash (\S+)`).FindStringSubmatch(line); m != nil && i < len(tour) {
			crashed = m[1]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", strings.Join(append(append([]string{}, setup...), line), "\n"))
		cmd.Dir, cmd.Env = root, env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("command of the README tour or docs/testbed.md failed (%v):\n  %s\n%s", err, line, out)
			continue
		}
		t.Logf("ok in %s: %s", time.Since(start).Round(time.Millisecond), line)
	}
	if !sourced {
		t.Error("the README's tour does not source bin/run/env")
	}
	if crashed == "" {
		t.Fatal("the README's tour has no `nodefence-testbed crash NODE`")
	}
	power, err := os.ReadFile(filepath.Join(runDir, "bmc-"+crashed, "state", "power"))
	if err != nil || strings.TrimSpace(string(power)) != "0" {
		t.Errorf("after crash %s its BMC's power state is %q (%v), want 0 (off)", crashed, power, err)
	}
	// The crashed node reads as powered off at once (its readiness waits for the grace period).
	out, err := exec.Command("bash", "-c", ". "+filepath.Join(runDir, "env")+` && grpcurl $GRPCURL $NF_COORDINATOR nodefence.coordinator.v1.ClusterService/ListNodes`).CombinedOutput()
	var nodes struct {
		Nodes []struct{ Name, Reason string }
	}
	if err != nil || json.Unmarshal(out, &nodes) != nil {
		t.Fatalf("ListNodes: %v\n%s", err, out)
	}
	reason := "(absent)"
	for _, n := range nodes.Nodes {
		if n.Name == crashed {
			reason = n.Reason
		}
	}
	if !strings.HasPrefix(reason, "powered off: fence ") {
		t.Errorf("after crash %s its node reads %q, want it powered off by its fence", crashed, reason)
	}
	// The metrics the env file names answer.
	out, err = exec.Command("bash", "-c", ". "+filepath.Join(runDir, "env")+` && n=0 && for v in $(compgen -v | grep '^NF_.*_METRICS$'); do n=$((n+1)); echo "$v"; curl -sf "${!v}" | grep -c '^nodefence_' || exit 1; done && [ $n -ge 6 ]`).CombinedOutput()
	if err != nil {
		t.Errorf("metrics: %v\n%s", err, out)
	}
}

// shLines returns the command lines of every sh block in the file's section (a "## " heading to the
// next): comments and blank lines dropped.
func shLines(t *testing.T, path, heading string) []string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(text), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", path, heading)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var lines []string
	for blocks := 0; ; blocks++ {
		_, rest, ok := strings.Cut(section, "\n```sh\n")
		if !ok {
			if blocks == 0 {
				t.Fatalf("%s's %q has no sh block", path, heading)
			}
			return lines
		}
		block, after, _ := strings.Cut(rest, "\n```")
		for _, l := range strings.Split(block, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		section = after
	}
}

// freePortBlock finds a base with n free TCP and UDP ports on 127.0.0.1 above the ephemeral range's
// usual start, so that the test does not collide with a `make run` on 7400.
func freePortBlock(t *testing.T, n int) int {
	for base := 20000 + os.Getpid()%5000; base < 32000; base += 100 {
		ok := true
		for p := base; p < base+n && ok; p++ {
			ok = portFree(p, false) == nil && portFree(p, true) == nil
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free block of ports")
	return 0
}

// testbed is a nodefence-testbed process and every process below it seen while it ran.
type testbed struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stdout *os.File // the read end of its stdout pipe
	mu     sync.Mutex
	out    bytes.Buffer
	seen   chan struct{} // something new in out
	runDir string
	procs  map[int]procInfo
}

type procInfo struct {
	start uint64 // start time in clock ticks after boot: tells a reused PID apart
	comm  string
}

func launchTestbed(t *testing.T, bin string, base, simulated int) *testbed {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "nodefence-testbed"), "--simulated", strconv.Itoa(simulated),
		"--grace", "3s", "--fence-timeout", "2s", "run")
	cmd.Env = append(os.Environ(), portBaseEnv+"="+strconv.Itoa(base))
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	tb := &testbed{cmd: cmd, done: make(chan struct{}), stdout: r, seen: make(chan struct{}, 1),
		runDir: filepath.Join(bin, "run"), procs: map[int]procInfo{}}
	go func() { _ = cmd.Wait(); close(tb.done) }()
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			tb.mu.Lock()
			tb.out.WriteString(sc.Text() + "\n")
			tb.mu.Unlock()
			select {
			case tb.seen <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		// A failed test leaves nothing running either: the testbed, then whatever it started.
		select {
		case <-tb.done:
		default:
			_ = cmd.Process.Kill()
			<-tb.done
		}
		for pid := range tb.alive() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("testbed output:\n%s", tb.output())
		}
	})
	return tb
}

func startTestbed(t *testing.T, bin string, base, simulated int) *testbed {
	t.Helper()
	tb := launchTestbed(t, bin, base, simulated)
	tb.waitFor(t, "Press Ctrl-C to stop everything")
	tb.collect()
	want := map[string]int{"ipmi_sim": simulated + 1, "coordinator": 1, "fence-driver": 1, "node-agent": 1}
	got := map[string]int{}
	for _, p := range tb.procs {
		got[p.comm]++
	}
	for name, n := range want {
		if got[name] != n {
			t.Fatalf("processes below the testbed: %v, want %d %s", got, n, name)
		}
	}
	return tb
}

func (tb *testbed) output() string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.out.String()
}

// waitFor waits until the testbed printed s.
func (tb *testbed) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for !strings.Contains(tb.output(), s) {
		select {
		case <-tb.seen:
		case <-tb.done:
			t.Fatalf("testbed exited (%v) before printing %q:\n%s", tb.cmd.ProcessState, s, tb.output())
		case <-deadline:
			t.Fatalf("testbed did not print %q within 90s:\n%s", s, tb.output())
		}
	}
}

// closeStdout closes the read end of the testbed's stdout, as a pipe reader that died does.
func (tb *testbed) closeStdout() { tb.stdout.Close() }

// collect records every process below the testbed now.
func (tb *testbed) collect() {
	for pid, info := range descendants(tb.cmd.Process.Pid) {
		tb.procs[pid] = info
	}
}

// alive returns the recorded processes still running (the same PID with the same start time, not
// a zombie).
func (tb *testbed) alive() map[int]procInfo {
	out := map[int]procInfo{}
	for pid, info := range tb.procs {
		if st, ok := readStat(pid); ok && st.start == info.start && st.state != "Z" {
			out[pid] = info
		}
	}
	return out
}

// stopAndCheck sends sig (0: none, the testbed stops by itself), waits for the testbed to end (with exit code 0 if clean) and checks that
// none of its processes survived and, if clean, that its run directory is gone.
func (tb *testbed) stopAndCheck(t *testing.T, sig syscall.Signal, clean bool) {
	t.Helper()
	tb.collect()
	if len(tb.procs) == 0 {
		t.Fatal("no processes seen below the testbed")
	}
	if sig != 0 {
		if err := tb.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-tb.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("testbed still running 60s after %s", sig)
	}
	if clean && !tb.cmd.ProcessState.Success() {
		t.Errorf("after %s the testbed ended with %v, want exit 0", sig, tb.cmd.ProcessState)
	}
	var left map[int]procInfo
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if left = tb.alive(); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for pid, info := range left {
		t.Errorf("after %s: %s (pid %d) is still running", sig, info.comm, pid)
	}
	if clean {
		if _, err := os.Stat(tb.runDir); err == nil {
			t.Errorf("after %s the run directory %s is still there", sig, tb.runDir)
		}
	}
	t.Logf("%s: %d processes stopped: %s", sig, len(tb.procs), tb.cmd.ProcessState)
}

type stat struct {
	ppid  int
	start uint64
	state string
	comm  string
}

// readStat parses /proc/PID/stat.
func readStat(pid int) (stat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, false
	}
	s := string(data)
	lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if lp < 0 || rp < lp {
		return stat{}, false
	}
	f := strings.Fields(s[rp+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return stat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return stat{ppid: ppid, start: start, state: f[0], comm: s[lp+1 : rp]}, true
}

// processesMentioning returns the running processes whose command line contains s.
func processesMentioning(s string) map[int]string {
	entries, _ := os.ReadDir("/proc")
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if cmdline := strings.ReplaceAll(string(data), "\x00", " "); err == nil && strings.Contains(cmdline, s) {
			if st, ok := readStat(pid); ok && st.state != "Z" {
				out[pid] = cmdline
			}
		}
	}
	return out
}

// descendants returns every process below pid.
func descendants(pid int) map[int]procInfo {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	stats := map[int]stat{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(p); ok {
			children[st.ppid] = append(children[st.ppid], p)
			stats[p] = st
		}
	}
	out := map[int]procInfo{}
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out[c] = procInfo{start: stats[c].start, comm: stats[c].comm}
			queue = append(queue, c)
		}
	}
	return out
}

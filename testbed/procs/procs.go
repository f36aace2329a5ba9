// Package procs starts and stops the child processes of the local testbed: each in its own process
// group, output to a log file, stopped by PID (SIGTERM, then SIGKILL after a deadline), and killed
// by the kernel if the process that started it dies first (SIGKILL included).
package procs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a started child process.
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan error
}

// Start runs bin with args, logging stdout and stderr to logPath (truncated first).
func Start(name, logPath, bin string, args ...string) (*Proc, error) {
	return start(os.O_TRUNC, name, logPath, bin, args...)
}

// StartAppend is Start appending to logPath, so that a restarted process's log follows the one of
// the run before.
func StartAppend(name, logPath, bin string, args ...string) (*Proc, error) {
	return start(os.O_APPEND, name, logPath, bin, args...)
}

func start(mode int, name, logPath, bin string, args ...string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|mode, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group keeps a terminal's Ctrl-C from reaching it before the testbed stops
	// it in order; Pdeathsig kills it when the testbed dies without stopping it (SIGKILL).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it; a nil p is a
// no-op.
func (p *Proc) Stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	if exited, _ := p.Exited(); exited {
		return nil
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err // keep the exit for Exited
		return nil
	case <-time.After(grace):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		p.done <- <-p.done
		return fmt.Errorf("%s (pid %d) did not stop within %s and was killed", p.Name, p.PID(), grace)
	}
}

// Kill SIGKILLs the process group and waits until the process is reaped; a nil p is a no-op.
func (p *Proc) Kill() {
	if p == nil {
		return
	}
	if exited, _ := p.Exited(); exited {
		return
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	p.done <- <-p.done // keep the exit for Exited
}

// Failure describes why the process is not usable (what), with how it ended and its log's tail.
func (p *Proc) Failure(what string) error {
	state := "running"
	if exited, err := p.Exited(); exited {
		state = fmt.Sprintf("exited: %v", err)
	}
	return fmt.Errorf("%s: %s (pid %d, %s); last lines of %s:\n%s", p.Name, what, p.PID(), state, p.Log, Tail(p.Log, 25))
}

// WaitUntil polls ready every 100 ms until it holds; it fails when the process exits or deadline
// passes first.
func (p *Proc) WaitUntil(deadline time.Time, ready func() bool) error {
	for !ready() {
		if exited, _ := p.Exited(); exited {
			return p.Failure("exited at start")
		}
		if time.Now().After(deadline) {
			return p.Failure("not ready in time")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// Tail returns the last n lines of the file at path (or the error reading it).
func Tail(path string, n int) string { return TailWithout(path, n, "") }

// TailWithout returns the last n lines of the file at path that do not contain skip (such as a
// server's access-log lines), or the error reading it.
func TailWithout(path string, n int, skip string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if skip == "" || !strings.Contains(l, skip) {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitTCP waits until addr accepts connections or the process exits or timeout passes.
func (p *Proc) WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited before listening on %s (%v); see %s", p.Name, addr, err, p.Log)
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New(p.Name + " is not listening on " + addr + " after " + timeout.String() + "; see " + p.Log)
}

// Terminate stops a started command by its PID: SIGTERM, then SIGKILL after grace; exited must be
// closed once the command's Wait returned. name labels errors.
func Terminate(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration, name string) error {
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop %s pid %d: %w", name, cmd.Process.Pid, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(grace):
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s pid %d: %w", name, cmd.Process.Pid, err)
	}
	<-exited
	return nil
}

package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/procs"
)

// proc is one daemon the cluster started. Its output is appended to Log.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been reaped
}

// spawn starts bin with args, stdout and stderr appended to logPath. The process gets its own
// process group and SIGKILL when the starting thread dies (so a crashed test leaves no daemon).
// wrap, when set, is a command prefix such as nsenter's.
func spawn(name, logPath string, env []string, wrap []string, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	argv := append(append(append([]string{}, wrap...), bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs and reaps the process.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// killWait SIGKILLs the process and waits up to 5 s until it is reaped.
func (p *proc) killWait() error {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return p.failure("not reaped 5 s after SIGKILL")
	}
}

// failure describes why the process is not usable, with the tail of its log.
func (p *proc) failure(what string) error {
	state := "running"
	if p.exited() {
		state = p.cmd.ProcessState.String()
	}
	return fmt.Errorf("%s: %s (pid %d, %s); last lines of %s:\n%s", p.name, what, p.pid(), state, p.log, procs.Tail(p.log, 25))
}

// poll calls check every interval until it returns true or an error, or deadline passes; then it
// returns an error made by timeout.
func poll(deadline time.Time, interval time.Duration, check func() (bool, error), timeout func() error) error {
	for {
		ok, err := check()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return timeout()
		}
		time.Sleep(interval)
	}
}

// errTimeout is wrapped by every deadline failure of the package.
var errTimeout = errors.New("deadline passed")

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

package fenceagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// result is how an agent run ended.
type result struct {
	code           int
	stdout, stderr []byte
}

// run executes path with args, writing stdin, in its own process group that is killed when ctx
// ends. err is non-nil only when the agent could not run or ran out of time.
func run(ctx context.Context, path string, args []string, stdin []byte) (result, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Not PCMK_service: under it agents disable their own timeouts.
	cmd.Env = []string{"LANG=C", "LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 200 * time.Millisecond
	err := cmd.Run()
	if cmd.Process != nil {
		// Children that outlived the agent (it may exit while its ipmitool still runs).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	res := result{stdout: stdout.Bytes(), stderr: stderr.Bytes()}
	if ctx.Err() != nil {
		return res, fmt.Errorf("killed at the deadline: %w", context.DeadlineExceeded)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return res, nil
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		res.code = ee.ExitCode()
		return res, nil
	}
	return res, err
}

// do runs the agent for action and returns its result; only failures to run are errors.
func (c *call) do(ctx context.Context, action string) (result, error) {
	var in bytes.Buffer
	fmt.Fprintf(&in, "action=%s\n", action)
	for _, k := range sortedKeys(c.params) {
		fmt.Fprintf(&in, "%s=%s\n", k, c.params[k])
	}
	res, err := run(ctx, c.path, nil, in.Bytes())
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return res, fmt.Errorf("fence agent %s %s: no result before the deadline, process group killed: %w", c.agent, action, context.DeadlineExceeded)
		}
		return res, fmt.Errorf("%w: fence agent %s %s: %v", fault.ErrFailedPrecondition, c.agent, action, err)
	}
	return res, nil
}

// failure describes a failed run, without secrets.
func (c *call) failure(action string, res result) error {
	msg := lastLine(res.stderr)
	for k, v := range c.params {
		if kit.IsSecret(k, nil) && v != "" {
			msg = strings.ReplaceAll(msg, v, "***")
		}
	}
	err := fault.ErrDevice
	if strings.Contains(msg, "Unable to connect/login") {
		err = fault.ErrUnauthenticated
	}
	return fmt.Errorf("%w: fence agent %s %s exited %d: %s", err, c.agent, action, res.code, msg)
}

// lastLine is the agent's last "Failed:" line, else its last line that is not a Python warning.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if _, msg, ok := strings.Cut(lines[i], "Failed: "); ok {
			return "Failed: " + strings.TrimSpace(msg)
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.Contains(l, "DeprecationWarning") && !strings.HasPrefix(l, "import ") {
			return l
		}
	}
	return "(no message)"
}

// checkPlug refuses a plug the agent does not list, for agents with plugs and a list action.
func (c *call) checkPlug(ctx context.Context) error {
	plug := c.params["plug"]
	if plug == "" || !c.meta.Supports("list") {
		return nil
	}
	plugs, err := c.list(ctx)
	if err != nil {
		return err
	}
	for _, p := range plugs {
		if p.GetId() == plug || p.GetName() == plug {
			return nil
		}
	}
	var inv fault.Invalid
	inv.Add("plug", "fence agent %s does not list plug %q on this device", c.agent, plug)
	return inv.Err()
}

func (c *call) list(ctx context.Context) ([]*driverv1.Plug, error) {
	res, err := c.do(ctx, "list")
	if err != nil {
		return nil, err
	}
	if res.code != 0 {
		return nil, c.failure("list", res)
	}
	sep := c.params["separator"]
	if sep == "" {
		sep = ","
	}
	var plugs []*driverv1.Plug
	for _, line := range strings.Split(string(res.stdout), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		id, name, _ := strings.Cut(line, sep)
		plugs = append(plugs, &driverv1.Plug{Id: id, Name: name})
	}
	return plugs, nil
}

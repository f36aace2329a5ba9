package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Outcome lines of the control protocol: the last line the testbed sends for a command.
const (
	replyOK    = "ok: "
	replyError = "error: "
)

func (c *cluster) envFile() string    { return filepath.Join(c.dir, "env") }
func (c *cluster) socketPath() string { return filepath.Join(c.dir, "control.sock") }
func socketIn(dir string) string      { return filepath.Join(dir, "control.sock") }
func shellQuote(s string) string      { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
func (m metricsEndpoint) url() string { return "http://" + m.addr + "/metrics" }

type metricsEndpoint struct{ name, env, addr string }

// metrics lists the Prometheus endpoints.
func (c *cluster) metrics() []metricsEndpoint {
	out := []metricsEndpoint{
		{"coordinator", "NF_COORDINATOR_METRICS", loopback(c.ports.coordMetrics)},
		{"fence-driver", "NF_DRIVER_METRICS", loopback(c.ports.driverMetrics)},
		{"node-agent", "NF_AGENT_METRICS", loopback(c.ports.agentMetrics)},
	}
	for i, s := range c.sims {
		out = append(out, metricsEndpoint{s.name, "NF_SIM" + strconv.Itoa(i+1) + "_METRICS", loopback(c.ports.simMetrics[i])})
	}
	return out
}

// writeEnv writes the env file a second terminal sources: addresses, certificates, tool path.
func (c *cluster) writeEnv() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# nodefence-testbed run (pid %d): source this file in another terminal: . %s\n", os.Getpid(), c.envFile())
	set := func(name, value string) { fmt.Fprintf(&b, "export %s=%s\n", name, shellQuote(value)) }
	set(runDirEnv, c.dir)
	set("NF_COORDINATOR", c.coordAddr)
	set("NF_DRIVER", c.driverAddr)
	set("NF_ETCD", c.etcdAddr)
	set("NF_PKI", c.pki.Dir)
	for _, m := range c.metrics() {
		set(m.env, m.url())
	}
	set("TLS", fmt.Sprintf("--tls-ca %s --tls-cert %s --tls-key %s", c.operator.CAFile, c.operator.CertFile, c.operator.KeyFile))
	set("GRPCURL", fmt.Sprintf("-cacert %s -cert %s -key %s", c.operator.CAFile, c.operator.CertFile, c.operator.KeyFile))
	fmt.Fprintf(&b, "export PATH=%s:\"$PATH\"\n", shellQuote(filepath.Join(c.opts.binDir, "tools")))
	tmp := c.envFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.envFile())
}

// serveControl listens on the run directory's control socket for console commands (`crash NODE`).
func (c *cluster) serveControl(ctx context.Context, out io.Writer) error {
	l, err := net.Listen("unix", c.socketPath())
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	c.control = l
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go c.handleControl(ctx, conn, out)
		}
	}()
	return nil
}

func (c *cluster) handleControl(ctx context.Context, conn net.Conn, out io.Writer) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(conn, 256)).ReadString('\n')
	if err != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	// Stop following when the caller goes away (Ctrl-C on `crash`); the crash stays.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, conn); cancel() }()
	fields := strings.Fields(line)
	if len(fields) != 2 || fields[0] != "crash" {
		fmt.Fprintf(conn, "%sunknown command %q (want: crash NODE)\n", replyError, strings.TrimSpace(line))
		return
	}
	say := func(at time.Time, format string, args ...any) {
		msg := fmt.Sprintf("%s  %s\n", at.Format("15:04:05.000"), fmt.Sprintf(format, args...))
		_, _ = io.WriteString(out, msg)
		_, _ = io.WriteString(conn, msg)
	}
	if err := c.crash(ctx, fields[1], say); err != nil {
		fmt.Fprintf(conn, "%s%v\n", replyError, err)
		return
	}
	fmt.Fprintf(conn, "%s%s fenced, power-off confirmed\n", replyOK, fields[1])
}

// crash stops a simulated node's agent (the node dies; its BMC still says on) and follows the
// coordinator until it has fenced the node and confirmed the power off.
func (c *cluster) crash(ctx context.Context, name string, say func(time.Time, string, ...any)) error {
	var victim *sim
	for _, s := range c.sims {
		if s.name == name {
			victim = s
		}
	}
	if victim == nil {
		if identity.ValidName(name) != nil {
			return errors.New("NODE: not a node name")
		}
		return fmt.Errorf("%s: not a simulated node (simulated: %s)", name, strings.Join(c.simNames(), ", "))
	}
	victim.mu.Lock()
	running := victim.cancel != nil
	victim.mu.Unlock()
	if !running {
		return fmt.Errorf("%s: already down (its agent is not running)", name)
	}
	since := time.Now()
	victim.silence()
	say(since, "%s: crashed from the console: its agent stopped; its BMC still says on", name)
	_, final, err := c.followFence(ctx, victim.name, since, c.opts.grace+c.opts.fenceTimeout+60*time.Second, say)
	if err != nil {
		return err
	}
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.ConfirmedOffAt == nil {
		return fmt.Errorf("%s: fence %s ended %s without a confirmed power-off", name, final.Id, short(final.Status))
	}
	return nil
}

// crash is the `crash NODE` command: it asks the testbed running in dir and prints what it says.
func crash(ctx context.Context, dir, node string, stdout, stderr io.Writer) int {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketIn(dir))
	if err != nil {
		fmt.Fprintf(stderr, "nodefence-testbed: no testbed is running in %s (%v); start one with `make run`, or give its --workdir (or $%s)\n",
			dir, err, runDirEnv)
		return 1
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	if _, err := fmt.Fprintf(conn, "crash %s\n", node); err != nil {
		fmt.Fprintln(stderr, "nodefence-testbed:", err)
		return 1
	}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, replyOK):
			fmt.Fprintln(stdout, strings.TrimPrefix(line, replyOK))
			return 0
		case strings.HasPrefix(line, replyError):
			fmt.Fprintln(stderr, "nodefence-testbed: crash:", strings.TrimPrefix(line, replyError))
			return 1
		}
		fmt.Fprintln(stdout, line)
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "stopped following; %s stays crashed and the coordinator goes on\n", node)
	} else {
		fmt.Fprintln(stderr, "nodefence-testbed: the testbed closed the connection (stopped?)")
	}
	return 1
}

// followFence reports a silent node's way to being fenced: judged Unknown after the grace period,
// why automatic fencing is held back (while it is), the fence record the coordinator creates on its
// own (after since), each operation of it, its end. It returns when the node was judged Unknown and
// the final record.
func (c *cluster) followFence(ctx context.Context, name string, since time.Time, timeout time.Duration,
	say func(time.Time, string, ...any)) (time.Time, *coordv1.NodeFence, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cc := coordv1.NewClusterServiceClient(c.conn)
	fc := coordv1.NewFenceServiceClient(c.conn)
	var detected time.Time
	var rec *coordv1.NodeFence
	blocked := ""
	for rec == nil {
		var node *coordv1.Node
		if r, err := cc.ListNodes(ctx, &coordv1.ListNodesRequest{}); err == nil {
			for _, n := range r.Nodes {
				if n.Name == name {
					node = n
				}
			}
		}
		if node != nil {
			if detected.IsZero() && node.Readiness == coordv1.Readiness_READINESS_UNKNOWN {
				detected = time.Now()
				say(detected, "%s: coordinator judges it Unknown: %s", name, node.Reason)
			}
			if node.FenceBlocked != blocked {
				blocked = node.FenceBlocked
				if blocked != "" {
					say(time.Now(), "%s: automatic fencing held back: %s", name, blocked)
				}
			}
		}
		if !detected.IsZero() {
			r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: name})
			if err == nil && len(r.Fences) > 0 && !r.Fences[0].CreatedAt.AsTime().Before(since) {
				rec = r.Fences[0]
				break
			}
		}
		select {
		case <-ctx.Done():
			if blocked != "" {
				return detected, nil, fmt.Errorf("%s: not fenced within %s: held back: %s", name, timeout, blocked)
			}
			return detected, nil, fmt.Errorf("%s: not fenced within %s", name, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
	say(rec.CreatedAt.AsTime(), "%s: coordinator fenced it automatically: record %s (epoch %d); evidence: %s",
		name, rec.Id, rec.Epoch, strings.Join(rec.Evidence, "; "))
	stream, err := fc.WatchFence(ctx, &coordv1.WatchFenceRequest{Id: rec.Id})
	if err != nil {
		return detected, nil, fmt.Errorf("WatchFence: %w", err)
	}
	var final *coordv1.NodeFence
	last := ""
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return detected, nil, fmt.Errorf("WatchFence: %w", err)
		}
		final = r.Fence
		msg := fenceLine(name, r.Fence)
		if msg != last {
			say(r.Fence.UpdatedAt.AsTime(), "%s", msg)
			last = msg
		}
	}
	if final == nil {
		return detected, nil, fmt.Errorf("WatchFence of %s ended without a record", rec.Id)
	}
	return detected, final, nil
}

// fenceLine is the console's line for one state of node name's fence record f.
func fenceLine(name string, f *coordv1.NodeFence) string {
	msg := fmt.Sprintf("%s: fence %s", name, short(f.Status))
	if n := len(f.Operations); n > 0 {
		op := f.Operations[n-1]
		msg += fmt.Sprintf(" — %s %s via %s (epoch %d)", op.Method, op.Action, op.Driver, op.Epoch)
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			msg += ": sent, awaiting read-back"
		} else {
			msg += fmt.Sprintf(": %s, read back %s in %s", short(op.Result), short(op.State), op.Elapsed.AsDuration().Round(time.Millisecond))
		}
	}
	if f.FinishedAt != nil {
		msg += " (finished)"
	}
	return msg
}

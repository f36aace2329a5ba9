package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/logind"
	"github.com/nodefence/nodefence/testbed/syncbuf"
)

// recorder is a real AgentService that keeps every message and acks it.
type recorder struct {
	agentv1.UnimplementedAgentServiceServer
	mu   sync.Mutex
	msgs []*agentv1.ConnectRequest
}

func (r *recorder) Connect(st agentv1.AgentService_ConnectServer) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.mu.Unlock()
		if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
	}
}

// events returns the condition and shutdown messages received so far, described.
func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		if c := m.GetCondition(); c != nil {
			out = append(out, c.Type.String()+"="+c.Status.String())
		}
		if s := m.GetShutdown(); s != nil {
			out = append(out, s.Phase.String())
		}
	}
	return out
}

func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRunWiring runs the whole binary against a recording coordinator, a real dbus-daemon with the
// login1 stand-in and the metrics endpoint: the pressure conditions reach the coordinator (a
// memory threshold above the node's memory is met at once), the graceful shutdown announces itself
// and releases the lock, and the metrics show all of it.
func TestRunWiring(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	coord := &recorder{}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, coord)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	bus, err := logind.StartBus(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	login1, err := logind.Serve(bus.Address, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer login1.Close()

	metricsAddr := freePort(t)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{
			"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=node-w1", "--boot-id-file=" + bootID(t),
			"--proc-root=../signals/testdata/proc", "--cgroup-root=../signals/testdata/v1", "--cgroup-version=1",
			"--nodefs-path=" + t.TempDir(),
			// More than the fixture's 16Gi: met at once.
			"--eviction-hard=memory.available<100Gi,nodefs.available<1%",
			"--shutdown-grace-period=2s", "--shutdown-grace-period-critical-pods=1s",
			"--logind-bus=" + bus.Address, "--metrics-listen=" + metricsAddr,
		}, io.Discard, &stderr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d:\n%s", code, stderr.String())
		}
	}()
	has := func(e string) func() bool {
		return func() bool {
			for _, got := range coord.events() {
				if got == e {
					return true
				}
			}
			return false
		}
	}
	waitUntil(ctx, t, "MemoryPressure true", has("CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_TRUE"))
	waitUntil(ctx, t, "DiskPressure false", has("CONDITION_TYPE_DISK_PRESSURE=CONDITION_STATUS_FALSE"))

	locks, err := login1.WaitLocks(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := login1.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-locks[0].Released:
	case <-ctx.Done():
		t.Fatalf("lock not released:\n%s", stderr.String())
	}
	waitUntil(ctx, t, "PODS_TERMINATED", has("SHUTDOWN_PHASE_PODS_TERMINATED"))
	ev := coord.events()
	started, ended := -1, -1
	for i, e := range ev {
		switch e {
		case "SHUTDOWN_PHASE_STARTED":
			started = i
		case "SHUTDOWN_PHASE_PODS_TERMINATED":
			ended = i
		}
	}
	if started < 0 || started > ended {
		t.Errorf("events %q: want STARTED before PODS_TERMINATED", ev)
	}

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`nodefence_agent_node_condition{condition="MemoryPressure"} 1`,
		`nodefence_agent_node_condition{condition="DiskPressure"} 0`,
		`nodefence_agent_signal_available{signal="memory.available"}`,
		`nodefence_agent_signal_available{signal="nodefs.inodesFree"}`,
		`nodefence_agent_stream_connected 1`,
		`nodefence_agent_unacked_messages`,
		`graceful_shutdown_start_time_seconds 1.`,
		`graceful_shutdown_end_time_seconds 1.`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s\nstderr:\n%s", body, stderr.String())
	}
}

// TestRunInhibitDelay runs the binary against the login1 stand-in, whose InhibitDelayMaxSec (1s)
// is below the 5s grace period: by default the agent writes its drop-in, logind (reloaded through
// systemd1 KillUnit) reports 5s and the agent takes its lock; when logind reads another directory
// the agent refuses to start; --manage-inhibit-delay=false only warns.
func TestRunInhibitDelay(t *testing.T) {
	tests := []struct {
		name string
		// logindReads is the directory the stand-in reads: "agent" is the one the agent writes to.
		logindReads string
		// manage is false for --manage-inhibit-delay=false, which forbids --logind-conf-dir.
		manage     bool
		wantCode   int
		wantLog    string
		wantMax    time.Duration
		wantDropIn bool
	}{
		{name: "raised", logindReads: "agent", manage: true, wantLog: "raised logind's InhibitDelayMaxSec", wantMax: 5 * time.Second, wantDropIn: true},
		{name: "logind reads another directory", logindReads: "other", manage: true, wantCode: 1,
			wantLog: "cannot raise logind's InhibitDelayMaxSec", wantMax: time.Second, wantDropIn: true},
		{name: "warning only", logindReads: "agent", wantLog: "below the shutdown grace period", wantMax: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			agentv1.RegisterAgentServiceServer(srv, &recorder{})
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()

			tmp := t.TempDir()
			bus, err := logind.StartBus(ctx, tmp)
			if err != nil {
				t.Fatal(err)
			}
			defer bus.Close()
			login1, err := logind.ServeConfig(bus.Address, logind.Config{InhibitDelayMax: time.Second, ConfDir: filepath.Join(tmp, tt.logindReads)})
			if err != nil {
				t.Fatal(err)
			}
			defer login1.Close()

			confDir := filepath.Join(tmp, "agent")
			args := []string{
				"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=node-s1", "--boot-id-file=" + bootID(t),
				"--proc-root=../signals/testdata/proc", "--cgroup-root=../signals/testdata/v1", "--cgroup-version=1",
				"--nodefs-path=" + t.TempDir(), "--shutdown-grace-period=5s", "--logind-bus=" + bus.Address,
			}
			if tt.manage {
				args = append(args, "--logind-conf-dir="+confDir)
			} else {
				args = append(args, "--manage-inhibit-delay=false")
			}
			var stderr syncbuf.Buffer
			done := make(chan int, 1)
			rctx, stop := context.WithCancel(ctx)
			defer stop()
			go func() { done <- Main(rctx, args, io.Discard, &stderr) }()
			locked := make(chan error, 1)
			go func() {
				_, err := login1.WaitLocks(rctx, 1)
				locked <- err
			}()
			var code int
			select {
			case code = <-done: // the agent stopped by itself
			case err := <-locked: // the agent runs: stop it
				if err != nil {
					t.Fatalf("%v:\n%s", err, stderr.String())
				}
				stop()
				code = <-done
			}
			out := stderr.String()
			t.Log(out)
			if code != tt.wantCode || !strings.Contains(out, tt.wantLog) {
				t.Errorf("exit %d logging %q; want %d logging %q", code, out, tt.wantCode, tt.wantLog)
			}
			if got := login1.InhibitDelayMax(); got != tt.wantMax {
				t.Errorf("logind's InhibitDelayMaxSec = %v, want %v", got, tt.wantMax)
			}
			text, err := os.ReadFile(filepath.Join(confDir, "99-nodefence.conf"))
			switch {
			case tt.wantDropIn && (err != nil || !strings.HasSuffix(string(text), "\n[Login]\nInhibitDelayMaxSec=5\n")):
				t.Errorf("drop-in: %q, %v; want InhibitDelayMaxSec=5", text, err)
			case !tt.wantDropIn && !errors.Is(err, os.ErrNotExist):
				t.Errorf("drop-in: %q, %v; want none", text, err)
			}
		})
	}
}

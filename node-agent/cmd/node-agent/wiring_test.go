package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/logind"
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
		done <- run(ctx, []string{
			"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=node-w1", "--boot-id-file=" + bootID(t),
			"--proc-root=../../signals/testdata/proc", "--cgroup-root=../../signals/testdata/v1", "--cgroup-version=1",
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

package shutdown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/logind"
)

// journal records what happened, in order, from every goroutine.
type journal struct {
	mu      sync.Mutex
	entries []string
	changed chan struct{}
}

func newJournal() *journal { return &journal{changed: make(chan struct{}, 1)} }

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	j.entries = append(j.entries, fmt.Sprintf(format, args...))
	j.mu.Unlock()
	select {
	case j.changed <- struct{}{}:
	default:
	}
}

func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.entries...)
}

// waitFor waits until an entry equals want.
func (j *journal) waitFor(ctx context.Context, t *testing.T, want string) {
	t.Helper()
	for {
		for _, e := range j.all() {
			if e == want {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %q; journal: %q", want, j.all())
		case <-j.changed:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sender records shutdown events in the journal; it stands for agent.Agent.Send.
type sender struct{ j *journal }

func (s sender) Send(m *agentv1.ConnectRequest) {
	s.j.add("send %s", strings.TrimPrefix(m.GetShutdown().GetPhase().String(), "SHUTDOWN_PHASE_"))
}

type pods []eviction.Pod

func (p pods) Pods(context.Context) ([]eviction.Pod, error) { return p, nil }

// terminator records each phase and simulates pods that take `took` to exit; with block it waits
// until its context ends. It notes whether the lock was still held while it ran.
type terminator struct {
	j     *journal
	took  time.Duration
	block bool
	lock  func() *logind.Lock
}

func (tm terminator) Terminate(ctx context.Context, ps []eviction.Pod, grace time.Duration) error {
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	tm.j.add("terminate %s grace=%s", strings.Join(names, ","), grace)
	if l := tm.lock(); l != nil {
		select {
		case <-l.Released:
			tm.j.add("LOCK RELEASED DURING A PHASE")
		default:
		}
	}
	if tm.block {
		<-ctx.Done()
		tm.j.add("terminate interrupted: %v", context.Cause(ctx))
		return ctx.Err()
	}
	select {
	case <-time.After(tm.took):
		tm.j.add("terminated %s", strings.Join(names, ","))
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type recorder struct{ j *journal }

func (r recorder) ShutdownStarted(time.Time) { r.j.add("metric start") }
func (r recorder) ShutdownEnded(time.Time)   { r.j.add("metric end") }

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// fixture is a real dbus-daemon on a private bus, the login1 stand-in and a Manager connected to it.
type fixture struct {
	login1 *logind.Server
	j      *journal
	done   chan error
}

func start(t *testing.T, ctx context.Context, cfg Config, tm terminator, p pods) *fixture {
	t.Helper()
	l, login1 := dialStandIn(t, ctx, logind.Config{InhibitDelayMax: 30 * time.Second})
	if max, err := l.InhibitDelayMax(ctx); err != nil || max != 30_000_000 {
		t.Errorf("InhibitDelayMax = %d, %v; want 30 s in µs", max, err)
	}

	f := &fixture{login1: login1, j: tm.j, done: make(chan error, 1)}
	tm.lock = func() *logind.Lock {
		if ls := login1.Locks(); len(ls) > 0 {
			return ls[len(ls)-1]
		}
		return nil
	}
	m, err := NewManager(cfg, Options{
		Inhibitor: LogindInhibitor{l}, Sender: sender{tm.j}, Pods: p, Terminator: tm, Recorder: recorder{tm.j},
		Log: slog.New(slog.NewTextHandler(logWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	go func() { f.done <- m.Run(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// TestGracefulShutdownOverDBus drives the Manager through a real dbus-daemon and the login1
// stand-in: the delay lock is taken at start; on PrepareForShutdown(true) STARTED is sent first,
// the phases run lowest priority first (the empty range skipped), PODS_TERMINATED is sent, and only
// then is the lock released; PrepareForShutdown(false) sends CANCELLED and takes a new lock.
func TestGracefulShutdownOverDBus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j := newJournal()
	cfg := Config{ByPriority: []PriorityGrace{{100000, 2 * time.Second}, {1000, 2 * time.Second}, {0, 2 * time.Second}}}
	f := start(t, ctx, cfg, terminator{j: j, took: 50 * time.Millisecond},
		pods{pod("web", 0), pod("db", 100000), pod("cache", 5)})

	locks, err := f.login1.WaitLocks(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	l := locks[0]
	if l.What != "shutdown" || l.Mode != "delay" || l.Who != inhibitWho {
		t.Errorf("lock = %+v, want a shutdown delay lock", l)
	}
	select {
	case <-l.Released:
		t.Fatal("lock released before any shutdown")
	default:
	}

	if err := f.login1.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Released:
	case <-ctx.Done():
		t.Fatalf("lock never released; journal %q", j.all())
	}
	j.add("lock released")
	want := []string{
		"send STARTED",
		"metric start",
		"terminate cache,web grace=2s", // priority 0 range first
		"terminated cache,web",
		// the 1000 range is empty: skipped at once
		"terminate db grace=2s",
		"terminated db",
		"send PODS_TERMINATED",
		"metric end",
		"lock released",
	}
	if diff := cmp.Diff(want, j.all()); diff != "" {
		t.Fatalf("order of events (-want +got):\n%s", diff)
	}

	if err := f.login1.PrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	j.waitFor(ctx, t, "send CANCELLED")
	if _, err := f.login1.WaitLocks(ctx, 2); err != nil {
		t.Fatalf("no new lock after the cancel: %v", err)
	}
}

// TestShutdownCancelledDuringPhase: PrepareForShutdown(false) in the middle of a phase stops it,
// sends CANCELLED, and the lock is never released.
func TestShutdownCancelledDuringPhase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j := newJournal()
	cfg := Config{GracePeriod: 10 * time.Second, CriticalGracePeriod: 5 * time.Second}
	f := start(t, ctx, cfg, terminator{j: j, block: true}, pods{pod("web", 0)})
	locks, err := f.login1.WaitLocks(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.login1.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	j.waitFor(ctx, t, "terminate web grace=5s")
	if err := f.login1.PrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	j.waitFor(ctx, t, "send CANCELLED")
	for _, e := range j.all() {
		if e == "send PODS_TERMINATED" {
			t.Errorf("PODS_TERMINATED sent for a cancelled shutdown: %q", j.all())
		}
	}
	select {
	case <-locks[0].Released:
		t.Errorf("lock released by a cancelled shutdown")
	default:
	}
	if got := len(f.login1.Locks()); got != 1 {
		t.Errorf("%d locks taken, want the first one kept", got)
	}
}

// TestDialLogindOutlivesContext: the context given to DialLogind bounds the setup only. The
// connection lives on after it ends, and PrepareForShutdown stays open, until Close. A context
// that has already ended fails the dial.
func TestDialLogindOutlivesContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bus, err := logind.StartBus(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	login1, err := logind.Serve(bus.Address, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer login1.Close()

	dialCtx, dialCancel := context.WithCancel(ctx)
	l, err := DialLogind(dialCtx, bus.Address)
	if err != nil {
		t.Fatal(err)
	}
	dialCancel()
	if err := login1.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	select {
	case active, ok := <-l.PrepareForShutdown():
		if !ok || !active {
			t.Fatalf("PrepareForShutdown gave %v, %v after the dial context ended; want true", active, ok)
		}
	case <-ctx.Done():
		t.Fatal("no PrepareForShutdown")
	}
	if _, err := l.InhibitDelayMax(ctx); err != nil {
		t.Errorf("InhibitDelayMax after the dial context ended: %v", err)
	}
	_ = l.Close()
	if _, ok := <-l.PrepareForShutdown(); ok {
		t.Error("PrepareForShutdown still open after Close")
	}

	if l, err := DialLogind(dialCtx, bus.Address); !errors.Is(err, context.Canceled) {
		if l != nil {
			_ = l.Close()
		}
		t.Errorf("DialLogind with an ended context = %v; want context.Canceled", err)
	}
}

// startBus starts a real dbus-daemon on a private bus for the test, stopped when the test ends.
func startBus(t *testing.T, ctx context.Context) *logind.Bus {
	t.Helper()
	bus, err := logind.StartBus(ctx, t.TempDir())
	if errors.Is(err, logind.ErrNoDaemon) {
		t.Fatalf("%v — this test needs a real dbus-daemon", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bus.Close()
		if out := bus.Output(); out != "" {
			t.Logf("dbus-daemon: %s", out)
		}
	})
	return bus
}

package shutdown

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Sender queues a message for the coordinator; agent.Agent is one. Shutdown events must never be
// dropped, which Agent.Send guarantees.
type Sender interface {
	Send(msg *agentv1.ConnectRequest)
}

// Inhibitor is the part of logind the Manager uses; *Logind is the real one. An interface here so
// that the Manager can be driven without a bus.
type Inhibitor interface {
	Inhibit(ctx context.Context, what, who, why, mode string) (lock io.Closer, err error)
	PrepareForShutdown() <-chan bool
}

// PodSource lists the pods running on the node. Standalone mode has none: every phase is empty and
// skipped at once.
type PodSource interface {
	Pods(ctx context.Context) ([]eviction.Pod, error)
}

// Terminator terminates pods with a grace period (each pod gets the smaller of it and its own) and
// returns when they are gone or ctx ends (the phase's time is up or the shutdown was cancelled).
// A phase whose time is up already (grace 0) still terminates its pods, as kubelet kills them.
type Terminator interface {
	Terminate(ctx context.Context, pods []eviction.Pod, grace time.Duration) error
}

// Recorder receives the graceful_shutdown_start/end_time_seconds values.
type Recorder interface {
	ShutdownStarted(at time.Time)
	ShutdownEnded(at time.Time)
}

// Options are the Manager's collaborators. Inhibitor and Sender are required.
type Options struct {
	Inhibitor Inhibitor
	Sender    Sender
	// Pods and Terminator are nil in standalone mode.
	Pods       PodSource
	Terminator Terminator
	// Recorder may be nil.
	Recorder Recorder
	// Log nil means slog.Default().
	Log *slog.Logger
}

// Who and why the agent gives logind for its lock.
const (
	inhibitWho = "nodefence node-agent"
	inhibitWhy = "Terminating pods and telling the nodefence coordinator before the node shuts down"
)

// Manager runs the graceful shutdown.
type Manager struct {
	cfg Config
	o   Options
	log *slog.Logger
}

// NewManager returns a Manager for cfg, which must be Enabled and valid.
func NewManager(cfg Config, o Options) (*Manager, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if !cfg.Enabled() {
		return nil, errors.New("graceful shutdown is off: both grace periods are 0")
	}
	if o.Inhibitor == nil || o.Sender == nil {
		return nil, errors.New("shutdown: Inhibitor and Sender are required")
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	return &Manager{cfg: cfg, o: o, log: log.With("component", "shutdown")}, nil
}

// outcome is how one shutdown run ended.
type outcome struct{ released bool }

// Run takes the delay inhibitor lock and handles PrepareForShutdown until ctx is done or the
// logind connection closes (an error). On PrepareForShutdown(true) it sends ShutdownEvent STARTED
// at once, runs the phases of Plan, sends PODS_TERMINATED and then releases the lock. On
// PrepareForShutdown(false) it stops a shutdown in progress, sends CANCELLED and takes the lock
// again if it had released it.
func (m *Manager) Run(ctx context.Context) error {
	lock, err := m.acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer func() {
		if lock != nil {
			_ = lock.Close()
		}
	}()
	var (
		cancel  = context.CancelFunc(func() {})
		running chan outcome // non-nil while a shutdown runs
		started bool         // a shutdown was announced and not cancelled
	)
	defer func() { cancel() }()
	stop := func() {
		if running == nil {
			return
		}
		cancel()
		if o := <-running; o.released {
			lock = nil
		}
		running = nil
	}
	defer stop()
	prepare := m.o.Inhibitor.PrepareForShutdown()
	for {
		select {
		case <-ctx.Done():
			return nil
		case o := <-running:
			running = nil
			if o.released {
				lock = nil
			}
		case active, ok := <-prepare:
			if !ok {
				if ctx.Err() != nil {
					return nil // the connection ended with our own context: a normal stop
				}
				return errors.New("shutdown: the logind connection closed")
			}
			switch {
			case active && !started:
				started = true
				sctx, stopShutdown := context.WithCancel(ctx)
				cancel = stopShutdown
				running = make(chan outcome, 1)
				go func(l io.Closer, done chan<- outcome) { done <- m.shutdown(sctx, l) }(lock, running)
			case !active && started:
				started = false
				stop()
				m.send(agentv1.ShutdownPhase_SHUTDOWN_PHASE_CANCELLED, time.Now(), 0)
				m.log.Warn("node shutdown cancelled")
				if lock == nil {
					if lock, err = m.acquire(ctx); err != nil {
						if ctx.Err() != nil {
							return nil
						}
						return err
					}
				}
			}
		}
	}
}

func (m *Manager) acquire(ctx context.Context) (io.Closer, error) {
	lock, err := m.o.Inhibitor.Inhibit(ctx, "shutdown", inhibitWho, inhibitWhy, "delay")
	if err != nil {
		return nil, err
	}
	m.log.Info("holding a logind delay inhibitor lock", "grace_period", m.cfg.Total(), "ranges", FormatByPriority(m.cfg.Ranges()))
	return lock, nil
}

func (m *Manager) send(phase agentv1.ShutdownPhase, at time.Time, grace time.Duration) {
	ev := &agentv1.ShutdownEvent{Phase: phase, At: timestamppb.New(at)}
	if grace > 0 {
		ev.GracePeriod = durationpb.New(grace)
	}
	m.o.Sender.Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: ev}})
}

// shutdown runs one graceful shutdown; it releases lock only when every phase is done, not when ctx
// is cancelled.
func (m *Manager) shutdown(ctx context.Context, lock io.Closer) outcome {
	start := time.Now()
	m.send(agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, start, m.cfg.Total())
	if m.o.Recorder != nil {
		m.o.Recorder.ShutdownStarted(start)
	}
	m.log.Warn("node is shutting down", "grace_period", m.cfg.Total())

	var pods []eviction.Pod
	if m.o.Pods != nil {
		var err error
		if pods, err = m.o.Pods.Pods(ctx); err != nil {
			m.log.Error("cannot list the pods to terminate; going on without them", "error", err)
		}
	}
	for i, ph := range Plan(m.cfg, pods) {
		log := m.log.With("phase", i+1, "min_priority", ph.Priority, "grace_period", ph.GracePeriod, "pods", len(ph.Pods))
		if ph.Skip() || m.o.Terminator == nil {
			log.Info("no pods in the priority range; skipping it")
			continue
		}
		log.Info("terminating pods")
		pctx, cancel := context.WithTimeout(ctx, ph.GracePeriod)
		err := m.o.Terminator.Terminate(pctx, ph.Pods, ph.GracePeriod)
		cancel()
		if ctx.Err() != nil {
			log.Warn("shutdown cancelled during the phase")
			return outcome{}
		}
		if err != nil {
			log.Warn("pods not all terminated within the phase", "error", err)
		}
	}
	end := time.Now()
	m.send(agentv1.ShutdownPhase_SHUTDOWN_PHASE_PODS_TERMINATED, end, 0)
	if m.o.Recorder != nil {
		m.o.Recorder.ShutdownEnded(end)
	}
	if err := lock.Close(); err != nil {
		m.log.Error("releasing the inhibitor lock", "error", err)
	}
	m.log.Warn("pods terminated; released the inhibitor lock", "took", end.Sub(start))
	return outcome{released: true}
}

// LogindInhibitor adapts *Logind to Inhibitor.
type LogindInhibitor struct{ *Logind }

// Inhibit takes the lock; the returned io.Closer is the lock's fd.
func (l LogindInhibitor) Inhibit(ctx context.Context, what, who, why, mode string) (io.Closer, error) {
	f, err := l.Logind.Inhibit(ctx, what, who, why, mode)
	if err != nil {
		return nil, err
	}
	return f, nil
}

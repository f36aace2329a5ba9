// Package job owns goroutines: a Group runs jobs — one-shot functions, functions on a timer, and
// observers of a channel — started together with one context, stopped together, and waited for:
// Stop returns only when every job has returned, so nothing a group started outlives it. A job's
// error is reported; a job's panic is reported and stops the group (its jobs share state the
// panicking one may have left half-changed).
//
// Every job's goroutine carries the profiler labels "group" and "job" (runtime/pprof): a goroutine
// a job starts inherits them, so a goroutine dump names the group and job of every goroutine that
// outlives its owner.
package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodefence/nodefence/services/clock"
)

// Job is a named function the group runs on a goroutine of its own.
type Job struct {
	name string
	run  func(ctx context.Context, g *Group) error
}

// Name is the job's name, as reports and labels give it.
func (j Job) Name() string { return j.name }

// OneShot runs fn once; the job ends when fn returns (an error is reported).
func OneShot(name string, fn func(ctx context.Context) error) Job {
	return Job{name: name, run: func(ctx context.Context, _ *Group) error { return fn(ctx) }}
}

// TimerOption changes a Timer job.
type TimerOption func(*timerOpts)

type timerOpts struct{ first bool }

// Immediately runs the timer's function once at the job's start, before the first interval.
func Immediately() TimerOption { return func(o *timerOpts) { o.first = true } }

// Timer runs fn every interval of the group's clock until the group stops. An error is reported
// and the timer goes on. A non-positive interval makes a job that does nothing.
func Timer(name string, every time.Duration, fn func(ctx context.Context) error, opts ...TimerOption) Job {
	var o timerOpts
	for _, f := range opts {
		f(&o)
	}
	return Job{name: name, run: func(ctx context.Context, g *Group) error {
		if every <= 0 {
			return nil
		}
		if o.first {
			g.report(name, fn(ctx))
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-g.clock.After(every):
			}
			if ctx.Err() != nil {
				return nil
			}
			g.report(name, fn(ctx))
		}
	}}
}

// Observer calls fn with every value received from in until in is closed or the group stops. An
// error is reported and the observer goes on.
func Observer[T any](name string, in <-chan T, fn func(ctx context.Context, v T) error) Job {
	return Job{name: name, run: func(ctx context.Context, g *Group) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case v, ok := <-in:
				if !ok {
					return nil
				}
				g.report(name, fn(ctx, v))
			}
		}
	}}
}

// PanicError is a job's panic, as reported.
type PanicError struct {
	Job   string
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("job %s panicked: %v", p.Job, p.Value) }

// Options configure a Group.
type Options struct {
	// Clock is what Timer jobs wait on; nil is the machine's clock.
	Clock clock.Clock
	// Report hears every error a job returns or reports, and every panic (a *PanicError), with the
	// job's name; it must not block. Nil logs them with slog's default logger.
	Report func(job string, err error)
}

// Group is a set of jobs owned together. The zero value is not usable; use NewGroup.
type Group struct {
	name   string
	clock  clock.Clock
	report func(job string, err error)

	mu      sync.Mutex
	state   int // created, running, stopped
	ctx     context.Context
	cancel  context.CancelFunc
	pending []Job
	running map[int]string // every job started and not returned, by sequence number
	seq     int
	done    chan struct{} // closed once stopped with nothing running
}

const (
	created = iota
	running
	stopped
)

// NewGroup returns a group named name (the "group" label of its goroutines).
func NewGroup(name string, opts Options) *Group {
	g := &Group{name: name, clock: opts.Clock, running: map[int]string{}, done: make(chan struct{})}
	if g.clock == nil {
		g.clock = clock.Machine
	}
	report := opts.Report
	if report == nil {
		report = func(job string, err error) { slog.Error("job failed", "group", name, "job", job, "err", err) }
	}
	g.report = func(job string, err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			report(job, err)
		}
	}
	return g
}

// Name is the group's name.
func (g *Group) Name() string { return g.name }

// Add registers jobs: before Start they wait for it, while the group runs they start at once.
// Once the group is stopped it refuses them (nothing runs) and returns false.
func (g *Group) Add(jobs ...Job) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stoppedLocked():
		return false
	case g.state == created:
		g.pending = append(g.pending, jobs...)
	default:
		for _, j := range jobs {
			g.startLocked(j)
		}
	}
	return true
}

// Go adds a one-shot job (see Add).
func (g *Group) Go(name string, fn func(ctx context.Context) error) bool {
	return g.Add(OneShot(name, fn))
}

// Start runs every job added so far, and from now on every job added, with a context derived from
// ctx; the group stops when ctx ends (its jobs see their context end, and it refuses new ones). A
// second Start, or a Start after Stop, does nothing.
func (g *Group) Start(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != created {
		return
	}
	g.state = running
	g.ctx, g.cancel = context.WithCancel(ctx)
	for _, j := range g.pending {
		g.startLocked(j)
	}
	g.pending = nil
}

func (g *Group) startLocked(j Job) {
	g.seq++
	id := g.seq
	g.running[id] = j.name
	go pprof.Do(g.ctx, pprof.Labels("group", g.name, "job", j.name), func(ctx context.Context) {
		defer g.finished(id)
		defer func() {
			if v := recover(); v != nil {
				g.report(j.name, &PanicError{Job: j.name, Value: v, Stack: debug.Stack()})
				g.Cancel()
			}
		}()
		g.report(j.name, j.run(ctx, g))
	})
}

func (g *Group) finished(id int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.running, id)
	g.closeIfDoneLocked()
}

// stoppedLocked reports whether the group is stopped: by Cancel, or by the end of Start's context.
func (g *Group) stoppedLocked() bool {
	return g.state == stopped || (g.ctx != nil && g.ctx.Err() != nil)
}

func (g *Group) closeIfDoneLocked() {
	if g.stoppedLocked() && len(g.running) == 0 {
		select {
		case <-g.done:
		default:
			close(g.done)
		}
	}
}

// Cancel stops the group without waiting: its context ends, and it refuses new jobs.
func (g *Group) Cancel() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel != nil {
		g.cancel()
	}
	g.state = stopped
	g.pending = nil
	g.closeIfDoneLocked()
}

// Wait returns nil once the group is stopped (Cancel, Stop, a panic; or the end of Start's context
// while a job ran) and every job it started has returned; or, when ctx ends first, an error naming
// the jobs still running. It starts no goroutine, and the group starts none besides its jobs'.
func (g *Group) Wait(ctx context.Context) error {
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("group %s: jobs still running: %s: %w", g.name, strings.Join(g.Running(), ", "), ctx.Err())
	}
}

// Stop cancels the group and waits for every job (see Wait).
func (g *Group) Stop(ctx context.Context) error {
	g.Cancel()
	return g.Wait(ctx)
}

// Done is closed once the group is stopped and every job has returned.
func (g *Group) Done() <-chan struct{} { return g.done }

// Running names the jobs started and not returned, sorted.
func (g *Group) Running() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, 0, len(g.running))
	for _, n := range g.running {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

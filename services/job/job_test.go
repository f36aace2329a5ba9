package job

import (
	"bytes"
	"context"
	"errors"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/clock"
)

// reports collects what a group reports.
type reports struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (r *reports) report(job string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[string][]error{}
	}
	r.errs[job] = append(r.errs[job], err)
}

func (r *reports) of(job string) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs[job]...)
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Stop returns only after every job returned, also a job that takes its time to wind down after
// its context ended: a Stop that returned on the cancellation alone fails here.
func TestStopWaitsForEveryJob(t *testing.T) {
	g := NewGroup("test", Options{})
	var returned atomic.Int32
	const n = 5
	for i := range n {
		g.Go("slow", func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(time.Duration(20*(i+1)) * time.Millisecond) // winding down
			returned.Add(1)
			return nil
		})
	}
	g.Start(context.Background())
	if got := len(g.Running()); got != n {
		t.Fatalf("%d jobs running after Start, want %d", got, n)
	}
	if err := g.Stop(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := returned.Load(); got != n {
		t.Fatalf("Stop returned while %d of %d jobs still ran", n-int(got), n)
	}
	if r := g.Running(); len(r) != 0 {
		t.Fatalf("jobs still listed after Stop: %v", r)
	}
}

// Wait gives up when its context ends, naming the jobs still running.
func TestWaitNamesStuckJobs(t *testing.T) {
	g := NewGroup("test", Options{})
	release := make(chan struct{})
	g.Go("stuck", func(context.Context) error { <-release; return nil })
	g.Start(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := g.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("Stop of a stuck job: %v, want an error naming it", err)
	}
	close(release)
	if err := g.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// Jobs added before Start wait for it; added while running start at once; added after Stop never
// run.
func TestAddBeforeDuringAfter(t *testing.T) {
	g := NewGroup("test", Options{})
	ran := make(chan string, 3)
	job := func(name string) func(context.Context) error {
		return func(context.Context) error { ran <- name; return nil }
	}
	if !g.Go("before", job("before")) {
		t.Fatal("Add before Start refused")
	}
	select {
	case n := <-ran:
		t.Fatalf("%s ran before Start", n)
	case <-time.After(20 * time.Millisecond):
	}
	g.Start(context.Background())
	if n := <-ran; n != "before" {
		t.Fatalf("ran %s", n)
	}
	if !g.Go("during", job("during")) {
		t.Fatal("Add while running refused")
	}
	if n := <-ran; n != "during" {
		t.Fatalf("ran %s", n)
	}
	if err := g.Stop(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if g.Go("after", job("after")) {
		t.Fatal("Add after Stop accepted")
	}
	select {
	case n := <-ran:
		t.Fatalf("%s ran after Stop", n)
	case <-time.After(20 * time.Millisecond):
	}
}

// The end of Start's context stops the group.
func TestParentContextStopsTheGroup(t *testing.T) {
	g := NewGroup("test", Options{})
	g.Go("wait", func(ctx context.Context) error { <-ctx.Done(); return nil })
	ctx, cancel := context.WithCancel(context.Background())
	g.Start(ctx)
	cancel()
	if err := g.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if g.Go("late", func(context.Context) error { return nil }) {
		t.Fatal("a group whose context ended accepted a job")
	}
}

// A job's error is reported; a panic is reported with its stack and stops the group.
func TestErrorsAndPanicsAreReported(t *testing.T) {
	var r reports
	g := NewGroup("test", Options{Report: r.report})
	g.Go("fails", func(context.Context) error { return errors.New("boom") })
	g.Go("other", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	g.Start(context.Background())
	g.Go("panics", func(context.Context) error { panic("oops") })
	if err := g.Wait(waitCtx(t)); err != nil {
		t.Fatalf("the panic did not stop the group: %v", err)
	}
	if errs := r.of("fails"); len(errs) != 1 || errs[0].Error() != "boom" {
		t.Errorf("fails reported %v", errs)
	}
	errs := r.of("panics")
	var p *PanicError
	if len(errs) != 1 || !errors.As(errs[0], &p) || p.Value != "oops" || !bytes.Contains(p.Stack, []byte("job_test.go")) {
		t.Errorf("panics reported %v", errs)
	}
	if errs := r.of("other"); len(errs) != 0 {
		t.Errorf("a job that returned its context's cancellation reported %v", errs)
	}
}

// A timer job runs on the group's clock: not before the interval, once per interval, and its
// errors are reported without ending it.
func TestTimerRunsOnTheGroupsClock(t *testing.T) {
	fake := clock.NewFake(time.Unix(1000, 0))
	var r reports
	g := NewGroup("test", Options{Clock: fake, Report: r.report})
	runs := make(chan time.Time, 10)
	g.Add(Timer("tick", time.Minute, func(context.Context) error {
		runs <- fake.Now()
		return errors.New("pass failed")
	}, Immediately()))
	g.Start(context.Background())
	if at := <-runs; !at.Equal(time.Unix(1000, 0)) {
		t.Fatalf("first run at %v", at)
	}
	for i := 1; i <= 3; i++ {
		waitFor(t, func() bool { return fake.Waiters() == 1 })
		fake.Advance(59 * time.Second)
		select {
		case <-runs:
			t.Fatal("ran before its interval")
		case <-time.After(10 * time.Millisecond):
		}
		fake.Advance(time.Second)
		if at := <-runs; !at.Equal(time.Unix(1000+int64(60*i), 0)) {
			t.Fatalf("run %d at %v", i, at)
		}
	}
	if err := g.Stop(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := len(r.of("tick")); n != 4 {
		t.Fatalf("%d errors reported, want 4", n)
	}
}

// An observer sees every value in order and ends when its channel closes.
func TestObserver(t *testing.T) {
	g := NewGroup("test", Options{})
	in := make(chan int)
	var got []int
	g.Add(Observer("obs", in, func(_ context.Context, v int) error { got = append(got, v); return nil }))
	g.Start(context.Background())
	for i := range 3 {
		in <- i
	}
	close(in)
	waitFor(t, func() bool { return len(g.Running()) == 0 })
	g.Cancel()
	if err := g.Wait(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Fatalf("observed %v", got)
	}
}

// A job's goroutine, and every goroutine it starts, carry the group's and the job's labels.
func TestGoroutinesAreLabelled(t *testing.T) {
	g := NewGroup("labelled-group", Options{})
	release := make(chan struct{})
	g.Go("labelled-job", func(context.Context) error {
		child := make(chan struct{})
		go func() { <-release; close(child) }()
		<-child
		return nil
	})
	g.Start(context.Background())
	waitFor(t, func() bool {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		return strings.Count(b.String(), `"group":"labelled-group"`) >= 1 && strings.Contains(b.String(), `"job":"labelled-job"`)
	})
	close(release)
	if err := g.Stop(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

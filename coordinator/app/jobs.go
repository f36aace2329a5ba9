package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodefence/nodefence/services/job"
)

// Who owns the app's goroutines (services/job): the App's process group owns what lives as long
// as Run — the gRPC server, the admission webhook, the kdump listener, the follower's view of the
// leader and, in Kubernetes mode, the witness and the fence ConfigMaps' reload; each term's group
// owns what the term starts — the engine loop, the audit writer, the record writer (the automatic
// and observed fences' records, the wrong-machine alarms, would release), the fence records' runs,
// the device checks, the history's
// pruning and, in Kubernetes mode, the reconciler and the controllers. A term's end stops its
// group and waits for every job before the next campaign; Run's end does the same for the
// process group after the term's. Nothing else in the app starts a goroutine.

// jobsWaitLog is how often a stop still waiting for jobs names them in the log.
const jobsWaitLog = 10 * time.Second

// termGroup names a term's job group (the "group" label of its goroutines).
func termGroup(epoch int64) string { return fmt.Sprintf("term-%d", epoch) }

// processGroup names the App's own job group.
const processGroup = "process"

// startProcess starts the process group's jobs, with ctx: Run's. What the gRPC server's Serve
// returns, and a job's panic, reach fatal.
func (a *App) startProcess(ctx context.Context, fatal chan<- error) {
	a.jobs = job.NewGroup(processGroup, job.Options{Clock: a.clock(), Report: func(name string, err error) {
		a.log.Error("a job of the coordinator failed", "job", name, "err", err)
		var p *job.PanicError
		if errors.As(err, &p) {
			a.log.Error("panic stack", "job", name, "stack", string(p.Stack))
			select {
			case fatal <- err:
			default:
			}
		}
	}})
	a.jobs.Go("grpc-server", func(context.Context) error {
		err := a.srv.Serve()
		select {
		case fatal <- err:
		default:
		}
		return nil
	})
	if a.kube != nil {
		a.kube.start(a.jobs)
	}
	if a.admission != nil {
		a.jobs.Go("admission-webhook", func(context.Context) error {
			if err := a.admission.serve(); err != nil {
				a.log.Error("admission webhook stopped", "err", err)
			}
			return nil
		})
	}
	if a.kdump != nil {
		a.jobs.Go("kdump-listener", func(ctx context.Context) error {
			if err := a.kdump.Run(ctx); err != nil {
				a.log.Error("kdump listener stopped", "err", err)
			}
			return nil
		})
	}
	a.jobs.Go("follower", func(ctx context.Context) error { a.follower.Run(ctx, followerPoll); return nil })
	a.jobs.Start(ctx)
}

// stopProcess stops the process group: its context ends, Close stops the server and the webhook
// (which do not follow a context), and every job is waited for.
func (a *App) stopProcess() {
	a.jobs.Cancel()
	a.Close()
	a.waitJobs(a.jobs)
}

// waitJobs waits for every job of the stopped group g, naming the ones that keep it waiting.
func (a *App) waitJobs(g *job.Group) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), jobsWaitLog)
		err := g.Wait(ctx)
		cancel()
		if err == nil {
			return
		}
		a.log.Warn("waiting for jobs to return before going on", "err", err)
	}
}

// stop ends the term's jobs and waits for them: called once the term ended, before the next
// campaign. The device checks' gauges are reset: a follower reports nothing, the next leader checks.
func (t *termParts) stop() {
	t.jobs.Cancel()
	t.a.waitJobs(t.jobs)
	t.a.devices.ok.Reset()
	if t.a.termStopped != nil {
		t.a.termStopped(t.term.Epoch)
	}
}

// report hears the term's jobs' errors and panics. A panic has stopped the term's group, so the
// term is resigned: a leader whose parts stopped must not hold the lease.
func (t *termParts) report(name string, err error) {
	var p *job.PanicError
	if errors.As(err, &p) {
		t.a.log.Error("a job of the term panicked; resigning", "epoch", t.term.Epoch, "job", name, "err", err, "stack", string(p.Stack))
		t.resign()
		return
	}
	t.a.log.Error("a job of the term failed", "epoch", t.term.Epoch, "job", name, "err", err)
}

// resign ends the term (bounded by resignTimeout).
func (t *termParts) resign() {
	ctx, cancel := context.WithTimeout(context.Background(), resignTimeout)
	defer cancel()
	_ = t.term.Resign(ctx)
}

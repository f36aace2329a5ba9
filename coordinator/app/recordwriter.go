package app

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	termcore "github.com/nodefence/nodefence/coordinator/term"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// recordWriter owns the term's core (coordinator/term) and is the one writer of the records and
// audit entries it decides — the wrong-machine alarm, would release, the automatic fences'
// creates — following the core's Ready contract (coordinator/term/doc.go): persist the Ready's
// writes under the term's epoch (compare-and-swap on the revision read; on a conflict the record
// is read again and Stepped in), then hand its acts on, then Advance. It runs as the term's
// record-writer job; the engine loop's OnReady and the release reconciler hand it inputs and
// never wait for etcd themselves.
type recordWriter struct {
	t    *termParts
	core *termcore.Core
	wake chan struct{}
	done chan struct{} // closed when run returns

	mu      sync.Mutex
	inbox   []queued
	ref     uint64
	waiting map[uint64]chan wouldReleased
}

// queued is one input waiting for the owner; a fence request waits for the fencing policy's
// verdict, which the owner asks for (ask) before it Steps the request.
type queued struct {
	in  termcore.Input
	req *engine.FenceRequest
}

// wouldReleased is the outcome a reconciler waiting in wouldRelease gets.
type wouldReleased struct {
	rec *coordv1.NodeFence
	err error
}

// recordWriteTimeout bounds one read, write or policy question of the owner.
const recordWriteTimeout = 10 * time.Second

func newRecordWriter(t *termParts) *recordWriter {
	return &recordWriter{t: t, core: termcore.New(t.term.Epoch), wake: make(chan struct{}, 1), done: make(chan struct{}),
		waiting: map[uint64]chan wouldReleased{}}
}

// submit queues inputs for the owner; it never blocks.
func (w *recordWriter) submit(q ...queued) {
	w.mu.Lock()
	w.inbox = append(w.inbox, q...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// fences queues the engine's automatic fence requests.
func (w *recordWriter) fences(reqs []engine.FenceRequest) {
	for i := range reqs {
		w.submit(queued{req: &reqs[i]})
	}
}

// verdicts queues the engine's proof verdicts.
func (w *recordWriter) verdicts(rs []engine.ProofResult) {
	for _, r := range rs {
		if r.Verdict == fencing.ProofWrongMachine {
			w.submit(queued{in: termcore.Verdict{Result: r}})
		}
	}
}

// wouldRelease hands the reconciler's finding to the core and waits for its outcome: the record's
// version written (nil when the record said so already).
func (w *recordWriter) wouldRelease(ctx context.Context, node string, f *coordv1.NodeFence, why string) (*coordv1.NodeFence, error) {
	ch := make(chan wouldReleased, 1)
	w.mu.Lock()
	w.ref++
	ref := w.ref
	w.waiting[ref] = ch
	w.mu.Unlock()
	w.submit(queued{in: termcore.WouldRelease{Node: node, Fence: f.GetId(), Why: why, At: w.t.a.now(), Ref: ref}})
	defer func() {
		w.mu.Lock()
		delete(w.waiting, ref)
		w.mu.Unlock()
	}()
	select {
	case r := <-ch:
		return r.rec, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-w.done:
		return nil, fmt.Errorf("record would release on fence %s: %w", f.GetId(), leader.ErrDeposed)
	}
}

// run owns the core until the term ends or a write is refused for the term's epoch.
func (w *recordWriter) run(ctx context.Context) error {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		w.mu.Lock()
		q := w.inbox
		w.inbox = nil
		w.mu.Unlock()
		for _, in := range q {
			if in.req != nil {
				in.in = w.request(ctx, *in.req)
			}
			w.core.Step(in.in)
		}
		if !w.drive(ctx) {
			w.t.a.log.Warn("record writer stopped: the term's epoch is no longer the leader's", "epoch", w.t.term.Epoch)
			return nil
		}
	}
}

// request is an automatic fence request as the core takes it: with the fencing policy's verdict
// (asked in Kubernetes mode when the rule needs one), the node's delay and its steps.
func (w *recordWriter) request(ctx context.Context, req engine.FenceRequest) termcore.Request {
	a := w.t.a
	r := termcore.Request{Req: req,
		Plan: func(step string) ([]fenceconfig.Resolved, error) { return a.fences().Plan(req.Node, step) }}
	if !req.Observe {
		nc := a.fences().Nodes[req.Node]
		r.Delay = fencing.NodeDelay(nc.Delay.Duration, nc.RandomDelay.Duration, rand.Int64N)
	}
	if a.kube != nil && termcore.NeedsPolicy(req) {
		pctx, cancel := context.WithTimeout(ctx, recordWriteTimeout)
		r.Policy.Needed, r.Policy.Why = a.kube.needsFencing(pctx, req.Node)
		r.Policy.Asked = true
		cancel()
	}
	r.At = a.now()
	return r
}

// drive runs the core's Ready until it is empty: reads and writes first, audit entries, then the
// acts, Advance, and the outcomes Stepped in. It returns false when the term's epoch was refused:
// nothing of that Ready acts and it is not Advanced.
func (w *recordWriter) drive(ctx context.Context) bool {
	for {
		rd := w.core.Ready()
		if rd.Empty() {
			return true
		}
		var outcomes []termcore.Input
		for _, id := range rd.Reads {
			outcomes = append(outcomes, w.read(ctx, id))
		}
		for _, wr := range rd.Writes {
			out, ok := w.persist(ctx, wr)
			if !ok {
				w.core.Step(termcore.Deposed{})
				return false
			}
			outcomes = append(outcomes, out)
		}
		for _, e := range rd.Audit {
			w.t.audit.Append(e.At, e.Node, e.Kind, e.Text)
		}
		for _, act := range rd.Acts {
			w.act(ctx, act)
		}
		w.core.Advance()
		for _, in := range outcomes {
			w.core.Step(in)
		}
	}
}

// read reads a record's current version for the core.
func (w *recordWriter) read(ctx context.Context, id string) termcore.Input {
	ctx, cancel := context.WithTimeout(ctx, recordWriteTimeout)
	defer cancel()
	v, err := w.t.a.store.GetFence(ctx, id)
	if err != nil {
		return termcore.ReadFailed{Fence: id, Err: err.Error()}
	}
	return termcore.RecordRead{Record: v.Fence, Revision: v.Revision}
}

// persist writes one record version under the term's epoch: a create, or an update compare-and-
// swapped on the revision it was read at. A lost compare-and-swap answers with the record read
// again (a Conflict). It returns false when the write's epoch is not the term's or etcd refused the epoch.
func (w *recordWriter) persist(ctx context.Context, wr termcore.Write) (termcore.Input, bool) {
	term := w.t.term
	if wr.Epoch != term.Epoch {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, recordWriteTimeout)
	defer cancel()
	if wr.Create {
		got, _, created, err := w.t.a.store.CreateFence(ctx, term, wr.Record)
		switch {
		case errors.Is(err, leader.ErrDeposed):
			return nil, false
		case err != nil:
			return termcore.Persisted{ID: wr.ID, Err: err.Error()}, true
		}
		return termcore.Persisted{ID: wr.ID, Record: got, Created: created}, true
	}
	_, err := w.t.a.store.UpdateFence(ctx, term, wr.Record, wr.Revision)
	switch {
	case errors.Is(err, leader.ErrConflict):
		v, err := w.t.a.store.GetFence(ctx, wr.Record.GetId())
		if err != nil {
			return termcore.Persisted{ID: wr.ID, Err: "read again after a write conflict: " + err.Error()}, true
		}
		return termcore.Conflict{ID: wr.ID, Record: v.Fence, Revision: v.Revision}, true
	case errors.Is(err, leader.ErrDeposed):
		return nil, false
	case err != nil:
		return termcore.Persisted{ID: wr.ID, Err: err.Error()}, true
	}
	return termcore.Persisted{ID: wr.ID, Record: wr.Record}, true
}

// act hands one of the core's acts on; its record, if any, is persisted.
func (w *recordWriter) act(ctx context.Context, act termcore.Act) {
	t, a := w.t, w.t.a
	switch act.Kind {
	case termcore.ActAlarm:
		if act.Err != "" {
			a.log.Error("wrong-machine alarm not written to the record", "fence", act.Fence, "err", act.Err)
		}
		t.recordWritten(ctx, act.Record)
		if a.kube != nil {
			a.proof.event(ctx, act.Proof)
		}
	case termcore.ActWouldRelease:
		r := wouldReleased{rec: act.Record}
		if act.Err != "" {
			r = wouldReleased{err: fmt.Errorf("record would release on fence %s: %s", act.Fence, act.Err)}
		} else if act.Record != nil {
			a.observeMx.wouldRelease.Inc()
		}
		w.mu.Lock()
		ch := w.waiting[act.Ref]
		w.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	case termcore.ActStartFence:
		t.autoFenceStarted(act)
	case termcore.ActWouldFence:
		t.observed(ctx, act)
	}
}

// recordWritten tells the engine of a record's version the writer persisted (nil: none).
func (t *termParts) recordWritten(ctx context.Context, f *coordv1.NodeFence) {
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, in := range engine.RecordWritten(f, t.a.now()) {
		_ = t.loop.Step(ctx, in)
	}
}

// autoFenceStarted starts an automatic fence whose record was created (or the node's active record
// that stood), and observes its stages.
func (t *termParts) autoFenceStarted(act termcore.Act) {
	a, req, got := t.a, act.Req, act.Record
	if act.Err != "" {
		a.log.Error("automatic fence not started", "node", req.Node, "err", act.Err)
		return
	}
	if act.Created {
		a.log.Warn("automatic fence started", "node", req.Node, "fence", got.Id, "evidence", strings.Join(got.Evidence, "; "))
		if !req.LastContact.IsZero() {
			a.metrics.ObserveStage("detect", req.NotReadySince.Sub(req.LastContact))
		}
		a.metrics.ObserveStage("decide", req.At.Sub(req.NotReadySince))
		if !req.NotReadySince.IsZero() {
			a.metrics.ObserveRecovery(got, loop.RecoveryNotReady, req.NotReadySince)
		}
	}
	t.runner.Start(got.Id)
}

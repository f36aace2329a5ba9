// Package fencing runs fence records: it dispatches a record's methods to driver services in order,
// writes every step to etcd under the leader's epoch BEFORE and AFTER each driver call, and marks a
// record DONE only when a driver confirmed the power state by read-back. A record is resumable: a new
// leader re-reads it and re-sends an unfinished call with the same operation id, which the driver
// answers without acting twice.
//
// The rules are pure functions over explicit inputs (record, facts, identity, now), so that the API,
// the wiring and the engine's scenario scripts apply and replay the same ones: the flow's next step
// (Decide, Record: machine.go), the records an operator's fence, an automatic fence and their ids
// make (NewRecord, AutoRecord, NewID: records.go), the Acknowledge rules (acknowledge.go) and the
// proof that the right machine went dark (proof.go). Only the Runner and Drivers do I/O.
package fencing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/clock"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/job"
	"github.com/nodefence/nodefence/services/tlsfiles"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Drivers hands out driver clients by endpoint and expected identity, one connection each. Every
// connection verifies that the server at the endpoint presents exactly the driver identity the
// configuration names (fenceconfig.Driver.Identity): a server of the same CA with another identity
// (an agent's certificate, another driver's) fails the TLS handshake and is never sent a call.
type Drivers struct {
	tls   tlsfiles.Files
	log   *slog.Logger
	mu    sync.Mutex
	certs *tlsfiles.Reloader // every connection's material, read again when the files change
	conns map[driverKey]*grpc.ClientConn
}

type driverKey struct{ endpoint, identity string }

// driverConnect bounds how long a driver host that does not answer at all (powered off, cut off)
// holds a call before the connection fails and the runner moves on to the driver's next endpoint,
// and how soon a host that came back is used again.
var driverConnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 500 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 10 * time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// NewDrivers returns a client pool using tls for every driver connection; log (may be nil) records
// every server refused for its identity.
func NewDrivers(tls tlsfiles.Files, log *slog.Logger) *Drivers {
	return &Drivers{tls: tls, log: log, conns: map[driverKey]*grpc.ClientConn{}}
}

// Client returns the client for endpoint, whose server must present spiffe://nodefence/driver/<name>.
func (d *Drivers) Client(endpoint, name string) (driverv1.FenceDriverServiceClient, error) {
	if name == "" {
		return nil, fmt.Errorf("driver at %s: no expected identity", endpoint)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k := driverKey{endpoint, name}
	c, ok := d.conns[k]
	if !ok {
		certs, err := d.certsLocked()
		if err != nil {
			return nil, err
		}
		if c, err = dial.New(endpoint, d.tls, dial.Peer(identity.Driver, name), dial.Log(d.log), dial.Certs(certs), dial.GRPC(grpc.WithConnectParams(driverConnect))); err != nil {
			return nil, err
		}
		d.conns[k] = c
	}
	return driverv1.NewFenceDriverServiceClient(c), nil
}

// Certs is the reloader of the driver connections' certificate and CA bundle (nil when they are
// plaintext), for the metrics.
func (d *Drivers) Certs() (*tlsfiles.Reloader, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.certsLocked()
}

func (d *Drivers) certsLocked() (*tlsfiles.Reloader, error) {
	if d.certs != nil || d.tls.Insecure {
		return d.certs, nil
	}
	r, err := d.tls.Watch(d.log, "calling the fence drivers")
	if err != nil {
		return nil, err
	}
	d.certs = r
	return r, nil
}

// Close closes every connection.
func (d *Drivers) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = map[driverKey]*grpc.ClientConn{}
}

// NodeFacts reports the coordinator's live view of a node: whether it is ready, and until when a
// kernel dump it announced keeps power management waiting.
type NodeFacts func(ctx context.Context, node string) (ready bool, kdumpUntil time.Time)

// NodeContact reports the node's latest witness contact (see Contact).
type NodeContact func(ctx context.Context, node string) Contact

// Runner executes records for one leadership term.
type Runner struct {
	Store *store.Store
	Term  *leader.Term
	// Config returns the current fence configuration (it may be reloaded while records run).
	Config  func() *fenceconfig.Config
	Drivers *Drivers
	// OpTimeout bounds one driver call including its read-back.
	OpTimeout time.Duration
	Policy    Policy
	// Now is the clock (decisions, record times, call times); nil means time.Now.
	Now func() time.Time
	// After waits on Now's clock (the pauses between decisions and between resends); nil waits on
	// the machine's timers.
	After func(time.Duration) <-chan time.Time
	// Jobs, when set, owns the records' goroutines (Start): the term's job group, which stops and
	// waits for them when the term ends. Nil runs them on goroutines of their own.
	Jobs *job.Group
	// Facts is the live node view; nil means "not ready, no dump" for every node.
	Facts NodeFacts
	// Contact is the node's latest witness contact, asked before every decision that may lead to a
	// driver call (the witness re-check, see recheck); nil means none was heard.
	Contact NodeContact
	// OnChange, if set, sees every record version the runner wrote (for the Kubernetes mirror and
	// pod release). It must not block.
	OnChange func(*coordv1.NodeFence)
	Log      *slog.Logger
	// Secrets reads Kubernetes Secrets for "<param>_secret" references (Kubernetes mode; nil elsewhere).
	Secrets fenceconfig.SecretReader
	// SelfFence is the term's proof by time for watchdog methods (nil: they fail).
	SelfFence SelfFence
	// Crash is a test hook: returning true at a point makes Run stop there as if the process died
	// (points: "before-write", "after-write", "after-call").
	Crash func(point string, rec *coordv1.NodeFence) bool

	mu      sync.Mutex
	running map[string]bool
}

// Notify passes a record version written outside the runner (an operator's acknowledgement) to
// OnChange, as the runner's own writes are: every version a leader writes reaches the same hook, so
// the metrics, the audit, the engine's node view, the Kubernetes mirror and its Events all hear of
// it. A nil runner or hook does nothing.
func (r *Runner) Notify(f *coordv1.NodeFence) {
	if r != nil && r.OnChange != nil {
		r.OnChange(f)
	}
}

// Start runs the record in the background unless it already runs. It stops when the term ends.
func (r *Runner) Start(id string) {
	r.mu.Lock()
	if r.running == nil {
		r.running = map[string]bool{}
	}
	if r.running[id] {
		r.mu.Unlock()
		return
	}
	r.running[id] = true
	r.mu.Unlock()
	done := func() { r.mu.Lock(); delete(r.running, id); r.mu.Unlock() }
	run := func(ctx context.Context) error {
		defer done()
		if err := r.Run(ctx, id); err != nil && ctx.Err() == nil {
			r.Log.Error("fence runner stopped", "fence", id, "err", err)
		}
		return nil
	}
	if r.Jobs == nil {
		go func() { _ = run(r.Term.Context()) }()
	} else if !r.Jobs.Go("fence "+id, run) {
		done() // the term's jobs stopped: the next leader resumes the record
	}
}

// Run drives one record until it is finished. It returns early (with an error) when the term ends or
// a write is refused; the next leader resumes the record.
func (r *Runner) Run(ctx context.Context, id string) error {
	for {
		v, err := r.Store.GetFence(ctx, id)
		if err != nil {
			return err
		}
		rec := v.Fence
		if rec.FinishedAt != nil {
			return nil
		}
		facts := Facts{Now: r.now(), Policy: r.Policy, Plan: func(step string) ([]fenceconfig.Resolved, error) { return r.Config().Plan(rec.Node, step) }}
		if r.Facts != nil {
			facts.NodeReady, facts.KdumpUntil = r.Facts(ctx, rec.Node)
		}
		facts.Contact = r.recheck(ctx, rec)
		facts.WatchdogFallback = r.watchdogFallback(rec.Node)
		d := Decide(rec, facts)
		switch {
		case d.Resend != nil:
			// Written by us or a previous leader but never answered: same operation id, so the
			// driver acts at most once.
			next := cloneFence(rec)
			r.call(ctx, next, d.Resend.OperationId)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if r.crash("after-call", next) {
				return errCrashed
			}
			if err := r.write(ctx, next, v.Revision); err != nil {
				if errors.Is(err, leader.ErrConflict) {
					continue
				}
				return err
			}
		case d.Next != nil:
			if err := r.write(ctx, d.Next, v.Revision); err != nil {
				if errors.Is(err, leader.ErrConflict) {
					continue // an acknowledgement changed it: re-read
				}
				return err
			}
			// The call is sent only after the operation is durably recorded; its outcome is
			// recorded by the next iteration's Resend path if we die in between.
		case d.Wait > 0:
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.after(min(d.Wait, time.Second)):
			}
		default:
			return nil
		}
	}
}

// recheck asks for the node's latest witness contact just before Decide, which aborts an
// automatic fence instead of its next driver call when a witness reached us (Reaching): every call
// is sent in the iteration that asked.
func (r *Runner) recheck(ctx context.Context, rec *coordv1.NodeFence) Contact {
	if r.Contact == nil || !rec.Automatic {
		return Contact{}
	}
	return r.Contact(ctx, rec.Node)
}

// after waits on the runner's clock.
func (r *Runner) after(d time.Duration) <-chan time.Time {
	if r.After != nil {
		return r.After(d)
	}
	return clock.Machine.After(d)
}

// watchdogFallback says whether the node opted in to the watchdog fallback and its agent last
// reported an armed watchdog.
func (r *Runner) watchdogFallback(node string) bool {
	if r.SelfFence == nil || r.Config == nil {
		return false
	}
	c := r.Config()
	return c != nil && c.Nodes[node].WatchdogFallback && r.SelfFence.Armed(node)
}

func (r *Runner) now() time.Time {
	clock := r.Now
	if clock == nil {
		clock = time.Now
	}
	return clock()
}

// errCrashed is returned by Run when the Crash hook stopped it.
var errCrashed = errors.New("crashed (test hook)")

func (r *Runner) crash(point string, rec *coordv1.NodeFence) bool {
	return r.Crash != nil && r.Crash(point, rec)
}

func (r *Runner) write(ctx context.Context, next *coordv1.NodeFence, rev int64) error {
	if r.crash("before-write", next) {
		return errCrashed
	}
	Stamp(next, r.Term.Epoch, r.now())
	if _, err := r.Store.UpdateFence(ctx, r.Term, next, rev); err != nil {
		return err
	}
	r.Log.Info("fence record", "fence", next.Id, "node", next.Node, "step", next.Step.String(), "status", next.Status.String(),
		"retries", next.Retries, "finished", next.FinishedAt != nil)
	if r.OnChange != nil {
		r.OnChange(next)
	}
	if r.crash("after-write", next) {
		return errCrashed
	}
	return nil
}

// call sends the operation to its driver and records the outcome in rec.
func (r *Runner) call(ctx context.Context, rec *coordv1.NodeFence, opID string) {
	var op *coordv1.Operation
	for _, o := range rec.Operations {
		if o.OperationId == opID {
			op = o
		}
	}
	start := r.now()
	var state driverv1.PowerState
	var err error
	if IsWatchdog(op) {
		state, err = r.watchdogOff(ctx, rec, op)
	} else {
		state, err = r.invokeKnown(ctx, rec, op)
	}
	errText := ""
	if err != nil {
		if s, ok := status.FromError(err); ok {
			errText = fmt.Sprintf("%s: %s", s.Code(), s.Message())
		} else {
			errText = err.Error()
		}
	}
	if ctx.Err() != nil {
		return // not an answer: the next leader re-sends
	}
	end := r.now()
	Answer(rec, opID, state, err, errText, end, end.Sub(start), r.Term.Epoch)
	r.Log.Info("driver call", "fence", rec.Id, "node", rec.Node, "step", op.Step.String(), "method", op.Method, "action", op.Action,
		"operation_id", op.OperationId, "epoch", r.Term.Epoch, "result", op.Result.String(), "error", op.Error,
		"elapsed", end.Sub(start).Round(time.Millisecond))
}

// invoke sends the operation to the method's endpoint number at (see invokeKnown for the order).
func (r *Runner) invoke(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation, at int) (driverv1.PowerState, error) {
	m, target, err := r.dispatch(rec, op)
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	cli, err := r.Drivers.Client(m.Endpoints[at%len(m.Endpoints)], m.Identity)
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.OpTimeout+2*time.Second)
	defer cancel()
	// The epoch sent is this term's, even for an operation a previous leader wrote: the driver then
	// refuses the previous leader from here on.
	if op.Action == "on" {
		resp, err := cli.PowerOn(cctx, &driverv1.PowerOnRequest{OperationId: op.OperationId, Epoch: r.Term.Epoch, Target: target, Timeout: durationpb.New(r.OpTimeout)})
		return resp.GetState(), err
	}
	resp, err := cli.PowerOff(cctx, &driverv1.PowerOffRequest{OperationId: op.OperationId, Epoch: r.Term.Epoch, Target: target, Timeout: durationpb.New(r.OpTimeout)})
	return resp.GetState(), err
}

// dispatch finds the operation's method (its driver's endpoints and identity) and the target with
// secrets resolved.
func (r *Runner) dispatch(rec *coordv1.NodeFence, op *coordv1.Operation) (*fenceconfig.Resolved, *driverv1.Target, error) {
	methods, err := Methods(rec, func(step string) ([]fenceconfig.Resolved, error) { return r.Config().Plan(rec.Node, step) })
	if err != nil {
		return nil, nil, err
	}
	var m *fenceconfig.Resolved
	for i := range methods {
		if methods[i].Name == op.Method && methods[i].Action == op.Action {
			m = &methods[i]
		}
	}
	if m == nil {
		return nil, nil, fmt.Errorf("method %s (%s) is no longer configured for %s", op.Method, op.Action, rec.Node)
	}
	if len(m.Endpoints) == 0 {
		return nil, nil, fmt.Errorf("method %s: driver %s has no endpoint", m.Name, m.Driver)
	}
	params, err := fenceconfig.ResolveSecrets(m.Parameters, r.Secrets)
	if err != nil {
		return nil, nil, err
	}
	return m, &driverv1.Target{Name: rec.Node, Parameters: params}, nil
}

func cloneFence(f *coordv1.NodeFence) *coordv1.NodeFence {
	return proto.Clone(f).(*coordv1.NodeFence)
}

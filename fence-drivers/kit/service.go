package kit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
)

// ServiceName is the full gRPC name of the service, for health checks.
const ServiceName = "nodefence.driver.v1.FenceDriverService"

// Service implements driverv1.FenceDriverServiceServer over a Driver. Handlers return domain errors
// (package fault); the server's interceptor maps them to gRPC codes.
type Service struct {
	driverv1.UnimplementedFenceDriverServiceServer

	d      Driver
	opts   Options
	desc   []*driverv1.Parameter // sorted by name
	epochs *epochStore
	ops    *opTable
	locks  deviceLocks
}

var _ driverv1.FenceDriverServiceServer = (*Service)(nil)

// NewService builds the service for d, loading the persisted epochs from opts.StateDir.
func NewService(d Driver, opts Options) (*Service, error) {
	if d == nil {
		return nil, errors.New("kit: nil driver")
	}
	opts.SetDefaults()
	var errs []error
	if opts.StateDir == "" {
		errs = append(errs, errors.New("kit: StateDir is required (epochs must survive restarts)"))
	}
	if opts.DefaultTimeout < 0 {
		errs = append(errs, errors.New("kit: DefaultTimeout must be positive"))
	}
	if opts.PollInterval < 0 {
		errs = append(errs, errors.New("kit: PollInterval must be positive"))
	}
	if opts.ConfirmReads < 1 || opts.ConfirmReads > 10 {
		errs = append(errs, fmt.Errorf("kit: ConfirmReads must be 1-10, got %d", opts.ConfirmReads))
	}
	desc := make([]*driverv1.Parameter, 0, len(d.Describe()))
	seen := map[string]string{}
	for _, p := range d.Describe() {
		for _, n := range append([]string{p.GetName()}, p.GetAliases()...) {
			if prev, dup := seen[NormalizeName(n)]; dup {
				errs = append(errs, fmt.Errorf("kit: driver %s describes %q twice (%s and %s)", d.Name(), n, prev, p.GetName()))
			}
			seen[NormalizeName(n)] = p.GetName()
		}
		desc = append(desc, proto.CloneOf(p))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(desc, func(a, b *driverv1.Parameter) int { return cmp.Compare(a.GetName(), b.GetName()) })
	epochs, err := loadEpochs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	ops, err := loadOpTable(opts.StateDir, opts.Log, maxRemembered)
	if err != nil {
		return nil, err
	}
	return &Service{d: d, opts: opts, desc: desc, epochs: epochs, ops: ops}, nil
}

// PowerOff turns the target off and returns once a status read-back saw it off.
func (s *Service) PowerOff(ctx context.Context, req *driverv1.PowerOffRequest) (*driverv1.PowerOffResponse, error) {
	m, err := s.mutate(ctx, mutation{"off", req.GetOperationId(), req.GetEpoch(), req.GetTarget(), req.GetTimeout(), ""},
		func(ctx context.Context, t Target, start time.Time) (proto.Message, error) {
			if err := s.d.PowerOff(ctx, t); err != nil {
				return nil, fmt.Errorf("power off: %w", err)
			}
			polls, at, err := s.await(ctx, t, driverv1.PowerState_POWER_STATE_OFF)
			if err != nil {
				return nil, err
			}
			return &driverv1.PowerOffResponse{
				State: driverv1.PowerState_POWER_STATE_OFF, ConfirmedAt: timestamppb.New(at),
				Polls: polls, Elapsed: durationpb.New(time.Since(start)),
			}, nil
		})
	if err != nil {
		return nil, err
	}
	return m.(*driverv1.PowerOffResponse), nil
}

// PowerOn turns the target on and returns once a status read-back saw it on.
func (s *Service) PowerOn(ctx context.Context, req *driverv1.PowerOnRequest) (*driverv1.PowerOnResponse, error) {
	m, err := s.mutate(ctx, mutation{"on", req.GetOperationId(), req.GetEpoch(), req.GetTarget(), req.GetTimeout(), ""},
		func(ctx context.Context, t Target, start time.Time) (proto.Message, error) {
			if err := s.d.PowerOn(ctx, t); err != nil {
				return nil, fmt.Errorf("power on: %w", err)
			}
			polls, at, err := s.await(ctx, t, driverv1.PowerState_POWER_STATE_ON)
			if err != nil {
				return nil, err
			}
			return &driverv1.PowerOnResponse{
				State: driverv1.PowerState_POWER_STATE_ON, ConfirmedAt: timestamppb.New(at),
				Polls: polls, Elapsed: durationpb.New(time.Since(start)),
			}, nil
		})
	if err != nil {
		return nil, err
	}
	return m.(*driverv1.PowerOnResponse), nil
}

// Reboot is power off, read-back off, power on, read-back on.
func (s *Service) Reboot(ctx context.Context, req *driverv1.RebootRequest) (*driverv1.RebootResponse, error) {
	m, err := s.mutate(ctx, mutation{"reboot", req.GetOperationId(), req.GetEpoch(), req.GetTarget(), req.GetTimeout(), ""},
		func(ctx context.Context, t Target, start time.Time) (proto.Message, error) {
			if err := s.d.PowerOff(ctx, t); err != nil {
				return nil, fmt.Errorf("reboot: power off: %w", err)
			}
			_, offAt, err := s.await(ctx, t, driverv1.PowerState_POWER_STATE_OFF)
			if err != nil {
				return nil, fmt.Errorf("reboot: %w", err)
			}
			if err := s.d.PowerOn(ctx, t); err != nil {
				return nil, fmt.Errorf("reboot: off confirmed, then power on: %w", err)
			}
			_, onAt, err := s.await(ctx, t, driverv1.PowerState_POWER_STATE_ON)
			if err != nil {
				return nil, fmt.Errorf("reboot: off confirmed, then %w", err)
			}
			return &driverv1.RebootResponse{
				State:          driverv1.PowerState_POWER_STATE_ON,
				OffConfirmedAt: timestamppb.New(offAt), OnConfirmedAt: timestamppb.New(onAt),
				Elapsed: durationpb.New(time.Since(start)),
			}, nil
		})
	if err != nil {
		return nil, err
	}
	return m.(*driverv1.RebootResponse), nil
}

// Status reads the power state. A device error is returned as the call's error, never as OFF.
func (s *Service) Status(ctx context.Context, req *driverv1.StatusRequest) (*driverv1.StatusResponse, error) {
	start := time.Now()
	t, key, ctx, cancel, err := s.readRequest(ctx, req.GetTarget(), req.GetTimeout())
	if err != nil {
		return nil, err
	}
	defer cancel()
	m, err := bounded(ctx, func(ctx context.Context) (proto.Message, error) {
		st, err := s.d.Status(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("status: %w", err)
		}
		if st == driverv1.PowerState_POWER_STATE_UNSPECIFIED {
			st = driverv1.PowerState_POWER_STATE_UNKNOWN
		}
		return &driverv1.StatusResponse{State: st, ObservedAt: timestamppb.Now()}, nil
	}, nil)
	s.opts.Log.Info("fence status", "driver", s.d.Name(), "caller", identity.Name(ctx), "target", t.Name, "device", key,
		"elapsed", time.Since(start), "code", fault.Code(err).String(), "err", err)
	up := err == nil
	s.opts.Metrics.observe(s.d.Name(), key, "status", fault.Code(err), time.Since(start), &up)
	if err != nil {
		return nil, err
	}
	return m.(*driverv1.StatusResponse), nil
}

// List enumerates the device's plugs when the driver implements Lister.
func (s *Service) List(ctx context.Context, req *driverv1.ListRequest) (*driverv1.ListResponse, error) {
	l, ok := s.d.(Lister)
	if !ok {
		return nil, fmt.Errorf("driver %s has no plugs to list: %w", s.d.Name(), fault.ErrUnimplemented)
	}
	start := time.Now()
	t, key, ctx, cancel, err := s.readRequest(ctx, req.GetTarget(), req.GetTimeout())
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer func() {
		s.opts.Log.Info("fence list", "driver", s.d.Name(), "caller", identity.Name(ctx), "target", t.Name, "device", key,
			"elapsed", time.Since(start), "code", fault.Code(err).String(), "err", err)
	}()
	m, err := bounded(ctx, func(ctx context.Context) (proto.Message, error) {
		plugs, err := l.List(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		slices.SortFunc(plugs, func(a, b *driverv1.Plug) int { return cmp.Compare(a.GetId(), b.GetId()) })
		return &driverv1.ListResponse{Plugs: plugs}, nil
	}, nil)
	if err != nil {
		return nil, err
	}
	return m.(*driverv1.ListResponse), nil
}

// Monitor checks, without changing power, that the device answers and accepts the credentials.
// Device failures are reported in the response; only a bad request is an error.
func (s *Service) Monitor(ctx context.Context, req *driverv1.MonitorRequest) (*driverv1.MonitorResponse, error) {
	mon, ok := s.d.(Monitorer)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot monitor: %w", s.d.Name(), fault.ErrUnimplemented)
	}
	start := time.Now()
	t, key, ctx, cancel, err := s.readRequest(ctx, req.GetTarget(), req.GetTimeout())
	if err != nil {
		return nil, err
	}
	defer cancel()
	_, err = bounded(ctx, func(ctx context.Context) (proto.Message, error) { return nil, mon.Monitor(ctx, t) }, nil)
	resp := &driverv1.MonitorResponse{Latency: durationpb.New(time.Since(start))}
	switch {
	case err == nil:
		resp.Reachable, resp.CredentialsOk, resp.Detail = true, true, "device answered and accepted the credentials"
	case errors.Is(err, fault.ErrUnauthenticated):
		resp.Reachable, resp.Detail = true, err.Error()
	case errors.Is(err, fault.ErrUnreachable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		resp.Detail = err.Error()
	default:
		resp.Reachable, resp.Detail = true, err.Error()
	}
	s.opts.Log.Info("fence monitor", "driver", s.d.Name(), "caller", identity.Name(ctx), "target", t.Name, "device", key,
		"reachable", resp.Reachable, "credentials_ok", resp.CredentialsOk, "elapsed", time.Since(start), "err", err)
	up := resp.Reachable && resp.CredentialsOk
	s.opts.Metrics.observe(s.d.Name(), key, "monitor", fault.Code(err), time.Since(start), &up)
	return resp, nil
}

// Describe returns the driver's name, description, parameters and actions.
func (s *Service) Describe(_ context.Context, req *driverv1.DescribeRequest) (*driverv1.DescribeResponse, error) {
	resp := &driverv1.DescribeResponse{Driver: s.d.Name(), Actions: []string{"off", "on", "reboot", "status"}}
	if doc, ok := s.d.(Documented); ok {
		resp.Description = doc.Description()
	}
	desc := s.desc
	if td, ok := s.d.(TargetDescriber); ok && req.GetTarget() != nil {
		params, text, err := td.DescribeTarget(req.GetTarget().GetParameters())
		if err != nil {
			return nil, err
		}
		desc, resp.Description = params, text
	}
	for _, p := range desc {
		resp.Parameters = append(resp.Parameters, proto.CloneOf(p))
	}
	if _, ok := s.d.(Lister); ok {
		resp.Actions = append(resp.Actions, "list")
	}
	if _, ok := s.d.(Monitorer); ok {
		resp.Actions = append(resp.Actions, "monitor")
	}
	return resp, nil
}

// mutation is the common part of PowerOff, PowerOn and Reboot requests.
type mutation struct {
	action  string
	opID    string
	epoch   int64
	target  *driverv1.Target
	timeout *durationpb.Duration
	caller  string // the caller's certificate identity (package identity), set by mutate
}

// actFunc performs a mutation on a validated target, under the device lock, after the epoch has
// been recorded. start is when the operation began.
type actFunc func(ctx context.Context, t Target, start time.Time) (proto.Message, error)

// mutate validates, checks the epoch, de-duplicates by operation_id and runs act once.
func (s *Service) mutate(ctx context.Context, m mutation, act actFunc) (proto.Message, error) {
	start := time.Now()
	m.caller = identity.Name(ctx)
	if err := coordinatorOnly(ctx); err != nil {
		// The server's policy refuses such a caller before it gets here; this is the kit's own
		// guarantee that no epoch is recorded from anyone else.
		s.audit(m, Target{Name: m.target.GetName()}, "", start, "rejected", err)
		return nil, err
	}
	var inv fault.Invalid
	if strings.TrimSpace(m.opID) == "" {
		inv.Add("operation_id", "required: a unique id per operation (repeat it only to retry the same operation)")
	} else {
		checkToken(&inv, "operation_id", m.opID, MaxOperationID, operationChars, true)
	}
	if m.epoch <= 0 {
		inv.Add("epoch", "must be positive (the caller's fencing token), got %d", m.epoch)
	}
	t, key := s.target(m.target, &inv)
	timeout := s.timeout(m.timeout, &inv)
	if err := inv.Err(); err != nil {
		s.audit(m, t, key, start, "rejected", err)
		return nil, err
	}
	if r, ok := s.d.(TargetResolver); ok {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		rt, err := r.ResolveTarget(rctx, t)
		cancel()
		if err != nil {
			var bad fault.Invalid
			if errors.As(err, &bad) {
				var inv fault.Invalid
				addPrefixed(&inv, "target.parameters.", bad)
				err = inv.Err()
			} else {
				err = fmt.Errorf("%s: finding the device of target %s: %w", m.action, t.Name, err)
			}
			s.audit(m, t, key, start, "rejected", err)
			return nil, err
		}
		t = rt
	}
	key = ResolvedKey(ctx, s.opts.Resolver, s.d, t)
	if err := s.epochs.check(key, m.epoch); err != nil {
		s.audit(m, t, key, start, "rejected", err)
		return nil, err
	}
	op, owner, err := s.ops.begin(m.opID, m.action+" on "+key)
	if err != nil {
		s.audit(m, t, key, start, "rejected", err)
		return nil, err
	}
	if owner {
		deadline := start.Add(timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		// The operation runs detached from the caller's cancellation (a repeat may wait for it),
		// but never past the deadline.
		go s.execute(m, t, key, start, deadline, op, act)
	} else {
		s.opts.Log.Info("fence operation repeated", "driver", s.d.Name(), "action", m.action,
			"operation_id", m.opID, "epoch", m.epoch, "target", t.Name, "device", key)
	}
	select {
	case <-op.done:
		if op.err != nil {
			return nil, op.err
		}
		return proto.Clone(op.resp), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s on %s: %w", m.action, key, ctx.Err())
	}
}

// execute runs one operation: device lock, epoch record (persisted before acting), act.
func (s *Service) execute(m mutation, t Target, key string, start, deadline time.Time, op *operation, act actFunc) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := func() (proto.Message, error) {
		unlock, err := s.locks.lock(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("%s: waiting for another operation on device %s: %w", m.action, key, err)
		}
		undo, err := s.epochs.observe(key, m.epoch)
		if err != nil {
			unlock()
			return nil, err
		}
		// The lock is released when act really returns (even after the deadline); a failed act first takes its epoch back.
		return bounded(ctx, func(ctx context.Context) (proto.Message, error) {
			ctx, cancel := softDeadline(ctx)
			defer cancel()
			resp, err := act(ctx, t, start)
			if err != nil && undo != nil {
				if uerr := undo(); uerr != nil {
					s.opts.Log.Error("failed call's epoch not taken back", "device", key, "epoch", m.epoch, "err", uerr)
				}
			}
			return resp, err
		}, unlock)
	}()
	s.ops.finish(m.opID, op, resp, err)
	result := "ok"
	if err != nil {
		result = "failed"
	}
	s.audit(m, t, key, start, result, err)
}

// await polls Status every PollInterval until ConfirmReads consecutive reads (taken without a
// pause) saw want, or the context ends. It never reports success without reads of want; on expiry
// the error wraps fault.ErrNotConfirmed when the device kept answering, else the context's error.
func (s *Service) await(ctx context.Context, t Target, want driverv1.PowerState) (polls int32, at time.Time, err error) {
	last := driverv1.PowerState_POWER_STATE_UNKNOWN
	var lastErr error
	streak, flapped := 0, false
	for {
		st, err := s.d.Status(ctx, t)
		polls++
		if err == nil && st == want {
			if streak++; streak >= s.opts.ConfirmReads {
				return polls, time.Now(), nil
			}
			last, lastErr = st, nil
			continue
		}
		flapped = flapped || streak > 0
		streak = 0
		if err == nil || ctx.Err() == nil || polls == 1 {
			// A read cut short by the deadline says nothing new about the device: keep the last.
			last, lastErr = st, err
		}
		if err != nil && ctx.Err() == nil && permanent(err) {
			return polls, time.Time{}, fmt.Errorf("read-back of %s: %w", stateName(want), err)
		}
		timer := time.NewTimer(s.opts.PollInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			if flapped && lastErr == nil {
				return polls, time.Time{}, fmt.Errorf("%w: wanted %s, the device's status flapped (never %d reads of %s in a row in %d reads): %w",
					fault.ErrNotConfirmed, stateName(want), s.opts.ConfirmReads, stateName(want), polls, ctx.Err())
			}
			if lastErr == nil {
				return polls, time.Time{}, fmt.Errorf("%w: wanted %s, the device still reported %s after %d reads: %w",
					fault.ErrNotConfirmed, stateName(want), stateName(last), polls, ctx.Err())
			}
			return polls, time.Time{}, fmt.Errorf("%s not confirmed after %d reads: %w (last read: %v)",
				stateName(want), polls, ctx.Err(), lastErr)
		case <-timer.C:
		}
	}
}

// coordinatorOnly refuses a call whose authorized identity is not a coordinator. A call with no
// identity at all comes from inside the process (tests, benchmarks), not from the network.
func coordinatorOnly(ctx context.Context) error {
	id, ok := identity.From(ctx)
	if !ok || id.Role == identity.Coordinator || id.Role == identity.Any {
		return nil
	}
	return fmt.Errorf("%w: %s may not call a fence driver (only the coordinator)", fault.ErrPermissionDenied, id)
}

// permanent reports errors that polling cannot cure.
func permanent(err error) bool {
	var inv fault.Invalid
	return errors.Is(err, fault.ErrUnauthenticated) || errors.As(err, &inv)
}

func stateName(s driverv1.PowerState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "POWER_STATE_"))
}

// readRequest validates a non-mutating request and returns its target and deadline context.
func (s *Service) readRequest(ctx context.Context, pt *driverv1.Target, d *durationpb.Duration) (Target, string, context.Context, context.CancelFunc, error) {
	var inv fault.Invalid
	t, key := s.target(pt, &inv)
	timeout := s.timeout(d, &inv)
	if err := inv.Err(); err != nil {
		return t, key, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return t, key, ctx, cancel, nil
}

// target validates and canonicalises a request target, adding problems to inv.
func (s *Service) target(pt *driverv1.Target, inv *fault.Invalid) (Target, string) {
	if pt == nil {
		inv.Add("target", "required")
		return Target{}, ""
	}
	t := Target{Name: pt.GetName()}
	before := len(*inv)
	checkRequestBounds(inv, pt.GetName(), pt.GetParameters(), nil)
	if len(*inv) > before {
		return t, ""
	}
	if len(pt.GetParameters()) == 0 {
		var req []string
		for _, p := range s.desc {
			if p.GetRequired() {
				req = append(req, p.GetName())
			}
		}
		inv.Add("target.parameters", "required (driver %s needs at least: %s)", s.d.Name(), strings.Join(req, ", "))
		return t, ""
	}
	params, err := Canonicalize(pt.GetParameters(), s.desc)
	var parsed any
	if err == nil {
		parsed, err = s.d.Parse(params)
	}
	if err != nil {
		addPrefixed(inv, "target.parameters.", err)
		return t, ""
	}
	t.Params, t.Parsed = params, parsed
	return t, s.d.DeviceKey(t)
}

func addPrefixed(inv *fault.Invalid, prefix string, err error) {
	var fi fault.Invalid
	var fe fault.FieldError
	switch {
	case errors.As(err, &fi):
		for _, e := range fi {
			*inv = append(*inv, fault.FieldError{Field: prefix + e.Field, Problem: e.Problem})
		}
	case errors.As(err, &fe):
		*inv = append(*inv, fault.FieldError{Field: prefix + fe.Field, Problem: fe.Problem})
	default:
		inv.Add(strings.TrimSuffix(prefix, "."), "%v", err)
	}
}

// timeout returns the request's timeout or the default, adding a problem to inv when invalid.
func (s *Service) timeout(d *durationpb.Duration, inv *fault.Invalid) time.Duration {
	if d == nil {
		return s.opts.DefaultTimeout
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
		inv.Add("timeout", "must be a non-negative duration")
		return s.opts.DefaultTimeout
	}
	if d.AsDuration() == 0 {
		return s.opts.DefaultTimeout
	}
	return d.AsDuration()
}

// audit writes the one log line of a mutating operation. Secret parameters are masked.
func (s *Service) audit(m mutation, t Target, key string, start time.Time, result string, err error) {
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
	}
	params := t.Params
	if params == nil {
		params = m.target.GetParameters()
	}
	s.opts.Log.Log(context.Background(), level, "fence operation",
		"driver", s.d.Name(), "caller", m.caller, "action", m.action, "operation_id", m.opID, "epoch", m.epoch,
		"target", t.Name, "device", key, "params", Masked(params, s.desc),
		"result", result, "code", fault.Code(err).String(), "elapsed", time.Since(start), "err", err)
	s.opts.Metrics.observe(s.d.Name(), key, m.action, fault.Code(err), time.Since(start), nil)
}

// softDeadline gives the driver a deadline a little before the hard one, so that it usually
// returns its own, more precise error (not confirmed, unreachable) before bounded gives up on it.
func softDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(100*time.Millisecond, time.Until(d)/10)
	return context.WithDeadline(ctx, d.Add(-margin))
}

// bounded runs fn and returns its result, or the context's error as soon as the context ends even
// if fn has not returned (a driver ignoring its context cannot hold the caller past the deadline).
// after, if not nil, runs once fn has really returned.
func bounded(ctx context.Context, fn func(context.Context) (proto.Message, error), after func()) (proto.Message, error) {
	if after == nil { // reads: mutations apply the soft deadline themselves, inside the device lock
		inner := fn
		fn = func(ctx context.Context) (proto.Message, error) {
			ctx, cancel := softDeadline(ctx)
			defer cancel()
			return inner(ctx)
		}
	}
	type result struct {
		m   proto.Message
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := fn(ctx)
		ch <- result{m, err}
		if after != nil {
			after()
		}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("the device did not answer in time: %w", ctx.Err())
	}
}

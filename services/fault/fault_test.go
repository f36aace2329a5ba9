package fault

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestStatusMapping(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{fmt.Errorf("node x: %w", ErrNotFound), codes.NotFound, "node x: not found"},
		{fmt.Errorf("target: %w", ErrStaleEpoch), codes.FailedPrecondition, "target: stale epoch"},
		{fmt.Errorf("bmc: %w", ErrUnreachable), codes.Unavailable, "bmc: device unreachable"},
		{fmt.Errorf("bmc: %w", ErrDevice), codes.Unavailable, "bmc: device reported an error"},
		{fmt.Errorf("bmc: %w", ErrUnauthenticated), codes.Unauthenticated, "bmc: credentials rejected"},
		{fmt.Errorf("bmc: %w", ErrNotConfirmed), codes.Aborted, "bmc: state not confirmed by read-back"},
		{Invalid{{"b", "bad"}, {"a", "required"}}.Err(), codes.InvalidArgument, "invalid: a: required; b: bad"},
		{FieldError{"node", "required"}, codes.InvalidArgument, "node: required"},
		{&NotLeaderError{LeaderID: "c2", LeaderAddress: "127.0.0.1:7002"}, codes.Unavailable, "not the leader; the leader is c2 at 127.0.0.1:7002"},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "call: context deadline exceeded"},
		{errors.New("password=hunter2 leaked"), codes.Internal, "internal error (see the server log)"},
		{fmt.Errorf("acknowledge n1: %w", ErrConflict), codes.Aborted, "acknowledge n1: concurrent modification"},
		{fmt.Errorf("driver x cannot monitor: %w", ErrUnimplemented), codes.Unimplemented, "driver x cannot monitor: not implemented"},
		{fmt.Errorf("node n1 holds 2 agent streams: %w", ErrResourceExhausted), codes.ResourceExhausted, "node n1 holds 2 agent streams: resource exhausted"},
		{fmt.Errorf("%w: no peer", ErrCallerUnauthenticated), codes.Unauthenticated, "caller not authenticated: no peer"},
		// A status from elsewhere (the etcd client, a driver) never passes through with its own code
		// and message: the code is translated, the message fixed.
		{status.Error(codes.Unimplemented, "method Pause not implemented"), codes.Unimplemented, "not implemented by this server"},
		{status.Error(codes.Unknown, "no"), codes.Internal, "internal error (see the server log)"},
		{status.Error(codes.FailedPrecondition, "etcdserver: revision compacted"), codes.Internal, "internal error (see the server log)"},
		{status.Error(codes.PermissionDenied, "etcdserver: permission denied"), codes.Internal, "internal error (see the server log)"},
		{fmt.Errorf("put node: %w", status.Error(codes.Unavailable, "etcdserver: leader changed")), codes.Unavailable, "a backend is unavailable, retry (see the server log)"},
		{status.Error(codes.ResourceExhausted, "etcdserver: too many requests"), codes.Unavailable, "a backend is overloaded, retry (see the server log)"},
		{status.Error(codes.DeadlineExceeded, "etcdserver: request timed out"), codes.DeadlineExceeded, "a backend did not answer in time (see the server log)"},
		// The etcd client's own errors name their code without carrying a status.
		{fmt.Errorf("put: %w", rpctypes.ErrNoLeader), codes.Unavailable, "a backend is unavailable, retry (see the server log)"},
		{rpctypes.ErrDuplicateKey, codes.Internal, "internal error (see the server log)"},
		// A domain error that also wraps a foreign status keeps its own code and message.
		{fmt.Errorf("bmc: %w (%w)", ErrUnreachable, status.Error(codes.Internal, "x")), codes.Unavailable, "bmc: device unreachable (rpc error: code = Internal desc = x)"},
	} {
		s := status.Convert(Status(tc.err))
		if s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("Status(%v) = %s %q, want %s %q", tc.err, s.Code(), s.Message(), tc.code, tc.msg)
		}
	}
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{status.Error(codes.Unknown, "no"), codes.Internal},
		{status.Error(codes.Unimplemented, "no"), codes.Unimplemented},
		{fmt.Errorf("x: %w", ErrConflict), codes.Aborted},
		{fmt.Errorf("x: %w", ErrStaleEpoch), codes.FailedPrecondition},
		{nil, codes.OK},
	} {
		if got := Code(tc.err); got != tc.code {
			t.Errorf("Code(%v) = %s, want %s", tc.err, got, tc.code)
		}
	}
	if Status(nil) != nil {
		t.Error("Status(nil) != nil")
	}
	if (Invalid{}).Err() != nil {
		t.Error("empty Invalid is not nil")
	}
}

// ErrNotSent crosses the wire as Unavailable with a structured detail, and only the detail counts:
// a status whose message merely says the same words, a plain ErrUnreachable, or another code with
// the detail is not "nothing was sent".
func TestNotSentDetail(t *testing.T) {
	wire := Status(fmt.Errorf("power off: %w: IPMI open session on BMC x", ErrNotSent))
	if status.Code(wire) != codes.Unavailable || !NotSent(wire) || !errors.Is(ErrNotSent, ErrUnreachable) {
		t.Fatalf("ErrNotSent on the wire: %v (code %s, NotSent %v)", wire, status.Code(wire), NotSent(wire))
	}
	forged, err := status.New(codes.Internal, "x").WithDetails(status.Convert(wire).Proto().GetDetails()[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []error{
		nil,
		Status(fmt.Errorf("%w: IPMI chassis control on BMC x", ErrUnreachable)),
		status.Error(codes.Unavailable, ErrNotSent.Error()+": the words without the detail"),
		forged.Err(),
	} {
		if NotSent(e) {
			t.Errorf("NotSent(%v) = true", e)
		}
	}
}

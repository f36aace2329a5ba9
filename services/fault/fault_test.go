package fault

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
		{status.Error(codes.Unimplemented, "no"), codes.Unimplemented, "no"},
	} {
		s := status.Convert(Status(tc.err))
		if s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("Status(%v) = %s %q, want %s %q", tc.err, s.Code(), s.Message(), tc.code, tc.msg)
		}
	}
	if Status(nil) != nil {
		t.Error("Status(nil) != nil")
	}
	if (Invalid{}).Err() != nil {
		t.Error("empty Invalid is not nil")
	}
}

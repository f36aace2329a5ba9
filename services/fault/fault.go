// Package fault defines the errors that cross nodefence's service boundaries and maps them, in this
// one place, to gRPC status codes. Domain packages return these (wrapped with %w); the server
// interceptor installed by package server turns them into statuses, so handlers never build statuses
// by hand and never leak internal details: anything unrecognised becomes Internal with a fixed message.
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Wrap them with fmt.Errorf("...: %w", ErrX) to add context.
var (
	// ErrNotFound: the named node, record or plug does not exist.
	ErrNotFound = errors.New("not found")
	// ErrStaleEpoch: the caller's fencing token is lower than one already seen; a deposed leader.
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrUnreachable: the device or peer did not answer.
	ErrUnreachable = errors.New("device unreachable")
	// ErrUnauthenticated: the device refused the credentials.
	ErrUnauthenticated = errors.New("credentials rejected")
	// ErrNotConfirmed: the action was accepted but a read-back never confirmed it.
	ErrNotConfirmed = errors.New("state not confirmed by read-back")
	// ErrFailedPrecondition: the request is valid but the system is not in a state to do it.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrDevice: the device answered but refused or failed the command (an IPMI completion code, an
	// SNMP error status). Retryable: the device is there.
	ErrDevice = errors.New("device reported an error")
	// ErrPermissionDenied: the caller may not call this method.
	ErrPermissionDenied = errors.New("permission denied")
)

// LeaderTrailer is the metadata key under which a follower names the leader's address.
const LeaderTrailer = "nodefence-leader"

// FieldError says what is wrong with one named field of a request or configuration.
type FieldError struct {
	Field   string
	Problem string
}

func (e FieldError) Error() string { return e.Field + ": " + e.Problem }

// Invalid is a list of field errors, reported all at once.
type Invalid []FieldError

// Add appends a field error.
func (v *Invalid) Add(field, format string, args ...any) {
	*v = append(*v, FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
}

// Err returns nil when there are no errors, else the list itself (sorted by field for stable output).
func (v Invalid) Err() error {
	if len(v) == 0 {
		return nil
	}
	out := append(Invalid(nil), v...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

func (v Invalid) Error() string {
	parts := make([]string, len(v))
	for i, e := range v {
		parts[i] = e.Error()
	}
	return "invalid: " + strings.Join(parts, "; ")
}

// NotLeaderError is returned by a replica that is not the leader.
type NotLeaderError struct {
	// LeaderID and LeaderAddress name the current leader; empty while an election is running.
	LeaderID, LeaderAddress string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddress == "" {
		return "not the leader; no leader elected yet, retry shortly"
	}
	return fmt.Sprintf("not the leader; the leader is %s at %s", e.LeaderID, e.LeaderAddress)
}

// Code returns the gRPC code for err.
func Code(err error) codes.Code {
	var inv Invalid
	var fe FieldError
	var nl *NotLeaderError
	if s, ok := status.FromError(err); ok && err != nil {
		return s.Code()
	}
	switch {
	case err == nil:
		return codes.OK
	case errors.As(err, &inv), errors.As(err, &fe):
		return codes.InvalidArgument
	case errors.As(err, &nl):
		return codes.Unavailable
	case errors.Is(err, ErrStaleEpoch), errors.Is(err, ErrFailedPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrUnreachable), errors.Is(err, ErrDevice):
		return codes.Unavailable
	case errors.Is(err, ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, ErrPermissionDenied):
		return codes.PermissionDenied
	case errors.Is(err, ErrNotConfirmed):
		return codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// Status converts err to a gRPC status error. Errors of known kinds keep their message; anything else
// becomes Internal with a fixed message (the details belong in the server log, not on the wire).
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := Code(err)
	if code == codes.Internal {
		return status.Error(codes.Internal, "internal error (see the server log)")
	}
	return status.Error(code, err.Error())
}

func leaderTrailer(ctx context.Context, err error) {
	var nl *NotLeaderError
	if errors.As(err, &nl) && nl.LeaderAddress != "" {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderTrailer, nl.LeaderAddress))
	}
}

// logInternal records the real cause of an error the client sees only as Internal.
func logInternal(log *slog.Logger, method string, err error) {
	if log != nil && Code(err) == codes.Internal {
		log.Error("internal error", "method", method, "err", err)
	}
}

// UnaryServerInterceptor maps handler errors with Status, logging the cause of every Internal one.
func UnaryServerInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			leaderTrailer(ctx, err)
			logInternal(log, info.FullMethod, err)
			return nil, Status(err)
		}
		return resp, nil
	}
}

// StreamServerInterceptor maps handler errors with Status, logging the cause of every Internal one.
func StreamServerInterceptor(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		err := h(srv, ss)
		if err != nil {
			logInternal(log, info.FullMethod, err)
			var nl *NotLeaderError
			if errors.As(err, &nl) && nl.LeaderAddress != "" {
				ss.SetTrailer(metadata.Pairs(LeaderTrailer, nl.LeaderAddress))
			}
			return Status(err)
		}
		return nil
	}
}

// LeaderFromTrailer returns the leader address a follower put in the trailer, or "" if there is none.
func LeaderFromTrailer(md metadata.MD) string {
	if v := md.Get(LeaderTrailer); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Package fault defines the errors that cross nodefence's service boundaries and maps them, in this
// one place, to gRPC status codes. Domain packages return these (wrapped with %w); the server
// interceptor installed by package server turns them into statuses, so handlers never build statuses
// by hand and never leak internal details: anything unrecognised becomes Internal with a fixed message.
// That includes an error that already carries a gRPC status from elsewhere (the etcd client, a
// driver): its code is translated and its message replaced, never passed through as is.
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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
	// ErrNotSent: the device did not answer before anything that could change it was sent (a BMC
	// that never answered the opening of a session): the operation certainly did not happen. It is
	// an ErrUnreachable (errors.Is); on the wire it is Unavailable with the structured detail
	// NotSentReason, which NotSent reads back on the client side.
	ErrNotSent = fmt.Errorf("%w before anything was sent to it", ErrUnreachable)
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
	// ErrCallerUnauthenticated: the caller presented no identity this server accepts.
	ErrCallerUnauthenticated = errors.New("caller not authenticated")
	// ErrConflict: a compare-and-swap lost to a concurrent change; retrying the whole read-modify-write
	// may succeed (gRPC's guidance for such conflicts is Aborted, not FailedPrecondition).
	ErrConflict = errors.New("concurrent modification")
	// ErrUnimplemented: this server does not offer the operation (a driver without plug listing).
	ErrUnimplemented = errors.New("not implemented")
	// ErrResourceExhausted: the caller already holds as much of a per-caller resource as it may (an
	// agent's open streams); retrying once it released some may succeed.
	ErrResourceExhausted = errors.New("resource exhausted")
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
	if err == nil {
		return codes.OK
	}
	if c, ok := domainCode(err); ok {
		return c
	}
	if f, ok := foreignStatus(err); ok {
		return f.code
	}
	return codes.Internal
}

// domainCode maps this package's errors (and the context's) to their codes.
func domainCode(err error) (codes.Code, bool) {
	var inv Invalid
	var fe FieldError
	var nl *NotLeaderError
	switch {
	case errors.As(err, &inv), errors.As(err, &fe):
		return codes.InvalidArgument, true
	case errors.As(err, &nl):
		return codes.Unavailable, true
	case errors.Is(err, ErrStaleEpoch), errors.Is(err, ErrFailedPrecondition):
		return codes.FailedPrecondition, true
	case errors.Is(err, ErrConflict), errors.Is(err, ErrNotConfirmed):
		return codes.Aborted, true
	case errors.Is(err, ErrNotFound):
		return codes.NotFound, true
	case errors.Is(err, ErrUnreachable), errors.Is(err, ErrDevice):
		return codes.Unavailable, true
	case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrCallerUnauthenticated):
		return codes.Unauthenticated, true
	case errors.Is(err, ErrPermissionDenied):
		return codes.PermissionDenied, true
	case errors.Is(err, ErrUnimplemented):
		return codes.Unimplemented, true
	case errors.Is(err, ErrResourceExhausted):
		return codes.ResourceExhausted, true
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return codes.Canceled, true
	}
	return codes.Internal, false
}

type mapped struct {
	code codes.Code
	msg  string
}

// foreign maps the code of a gRPC status that did not come from this package (the etcd client's, a
// driver's as the coordinator received it) to the code and fixed message this server answers with.
// Only the codes that tell a caller what to do next survive; the rest become Internal.
var foreign = map[codes.Code]mapped{
	codes.Unavailable:       {codes.Unavailable, "a backend is unavailable, retry (see the server log)"},
	codes.DeadlineExceeded:  {codes.DeadlineExceeded, "a backend did not answer in time (see the server log)"},
	codes.Canceled:          {codes.Canceled, "canceled"},
	codes.ResourceExhausted: {codes.Unavailable, "a backend is overloaded, retry (see the server log)"},
	// What grpc-go's generated Unimplemented*Server answers for a method a server does not offer.
	codes.Unimplemented: {codes.Unimplemented, "not implemented by this server"},
}

// internal is what the client sees of anything else.
var internal = mapped{codes.Internal, "internal error (see the server log)"}

// coder is an error that names its gRPC code without carrying a status: the etcd client's
// rpctypes.EtcdError ("etcdserver: no leader" and the like) is one.
type coder interface{ Code() codes.Code }

// foreignStatus reports how the gRPC code err carries (in a status, or as a coder) maps; ok is false
// when it carries none.
func foreignStatus(err error) (m mapped, ok bool) {
	var code codes.Code
	var c coder
	if s, isStatus := status.FromError(err); isStatus {
		code = s.Code()
	} else if errors.As(err, &c) {
		code = c.Code()
	} else {
		return internal, false
	}
	if m, known := foreign[code]; known {
		return m, true
	}
	return internal, true
}

// Status converts err to a gRPC status error. Errors of known kinds keep their message; a status
// from elsewhere gets its code translated and a fixed message; anything else becomes Internal with a
// fixed message (the details belong in the server log, not on the wire).
func Status(err error) error {
	if err == nil {
		return nil
	}
	if code, ok := domainCode(err); ok {
		st := status.New(code, err.Error())
		if reason := deviceReason(err); reason != "" {
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain}); derr == nil {
				st = d
			}
		}
		return st.Err()
	}
	m, _ := foreignStatus(err)
	return status.Error(m.code, m.msg)
}

// Domain is the domain of nodefence's structured error details (google.rpc.ErrorInfo).
const Domain = "nodefence.io"

// NotSentReason is the ErrorInfo reason of ErrNotSent: the device did not answer before anything
// was sent to it.
const NotSentReason = "DEVICE_UNREACHABLE_NOTHING_SENT"

// UnreachableReason and DeviceErrorReason are the ErrorInfo reasons of ErrUnreachable (other than
// ErrNotSent) and ErrDevice: both are Unavailable on the wire, and only the detail tells a device
// that did not answer from one that answered with an error.
const (
	UnreachableReason = "DEVICE_UNREACHABLE"
	DeviceErrorReason = "DEVICE_ERROR"
)

// deviceReason is the ErrorInfo reason Status attaches to err ("" for none).
func deviceReason(err error) string {
	switch {
	case errors.Is(err, ErrDevice):
		return DeviceErrorReason
	case errors.Is(err, ErrNotSent):
		return NotSentReason
	case errors.Is(err, ErrUnreachable):
		return UnreachableReason
	}
	return ""
}

// reason is the nodefence ErrorInfo reason a gRPC status error carries ("" for none).
func reason(err error) string {
	s, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range s.Details() {
		if e, ok := d.(*errdetails.ErrorInfo); ok && e.GetDomain() == Domain {
			return e.GetReason()
		}
	}
	return ""
}

// Unreachable says whether a driver call's error means the device or its driver host did not
// answer: this package's ErrUnreachable (locally, or on the wire as Unavailable with its detail), a
// gRPC Unavailable without a device-error detail (the driver host could not be reached), or no
// answer in time (DeadlineExceeded). A device that answered with an error (ErrDevice, the detail
// DeviceErrorReason) is reachable. Only codes and details count, never the message.
func Unreachable(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrDevice):
		return false
	case errors.Is(err, ErrUnreachable), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.DeadlineExceeded:
		return true
	case codes.Unavailable:
		return reason(err) != DeviceErrorReason
	}
	return false
}

// NotSent says whether err (an error from this package, or a gRPC status a server made with Status)
// is ErrNotSent: the device never answered, so the operation certainly did not happen. Only the
// structured detail counts, never the message.
func NotSent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrNotSent) {
		return true
	}
	return status.Code(err) == codes.Unavailable && reason(err) == NotSentReason
}

// ElectionTrailer is the metadata key under which a replica says that no leader is elected yet:
// the request was refused before anything was done, and asking again shortly is safe.
const ElectionTrailer = "nodefence-election"

// notLeaderTrailer is the trailer of a refusal by a replica that is not the leader: the leader's
// address when one is known, else that an election runs; nil for any other error.
func notLeaderTrailer(err error) metadata.MD {
	var nl *NotLeaderError
	switch {
	case !errors.As(err, &nl):
		return nil
	case nl.LeaderAddress != "":
		return metadata.Pairs(LeaderTrailer, nl.LeaderAddress)
	default:
		return metadata.Pairs(ElectionTrailer, "running")
	}
}

func leaderTrailer(ctx context.Context, err error) {
	if md := notLeaderTrailer(err); md != nil {
		_ = grpc.SetTrailer(ctx, md)
	}
}

// logInternal records the real cause of an error the client sees only with a fixed message.
func logInternal(log *slog.Logger, method string, err error) {
	if _, domain := domainCode(err); log != nil && !domain {
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
			if md := notLeaderTrailer(err); md != nil {
				ss.SetTrailer(md)
			}
			return Status(err)
		}
		return nil
	}
}

// ElectionFromTrailer says whether a replica refused a call because no leader is elected yet.
func ElectionFromTrailer(md metadata.MD) bool { return len(md.Get(ElectionTrailer)) > 0 }

// LeaderFromTrailer returns the leader address a follower put in the trailer, or "" if there is none.
func LeaderFromTrailer(md metadata.MD) string {
	if v := md.Get(LeaderTrailer); len(v) > 0 {
		return v[0]
	}
	return ""
}

package dial

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// electing answers Check with "no leader elected yet" for its first refusals calls, then with the
// leader's address when redirect is set, else SERVING.
type electing struct {
	healthpb.UnimplementedHealthServer
	refusals int32
	redirect string
	calls    atomic.Int32
}

func (e *electing) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if e.calls.Add(1) <= e.refusals {
		return nil, &fault.NotLeaderError{}
	}
	if e.redirect != "" {
		return nil, &fault.NotLeaderError{LeaderID: "other", LeaderAddress: e.redirect}
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func serve(t *testing.T, h healthpb.HealthServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(fault.UnaryServerInterceptor(nil)))
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func check(t *testing.T, addr string, opts ...Option) error {
	t.Helper()
	cc, err := New(addr, tlsfiles.Files{Insecure: true}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// A call refused while an election runs is asked again until the replica answers; without the
// option, or past its bound, the refusal reaches the caller; a redirect to a known leader is the
// caller's to follow and is not asked again.
func TestWaitOutElections(t *testing.T) {
	e := &electing{refusals: 3}
	if err := check(t, serve(t, e), WaitOutElections(10*time.Second)); err != nil || e.calls.Load() != 4 {
		t.Fatalf("with the option: %v after %d calls; want an answer after 4", err, e.calls.Load())
	}

	plain := &electing{refusals: 3}
	if err := check(t, serve(t, plain)); status.Code(err) != codes.Unavailable || plain.calls.Load() != 1 {
		t.Fatalf("without the option: %v after %d calls; want the refusal after 1", err, plain.calls.Load())
	}

	long := &electing{refusals: 1000}
	start := time.Now()
	if err := check(t, serve(t, long), WaitOutElections(700*time.Millisecond)); status.Code(err) != codes.Unavailable || time.Since(start) > 5*time.Second {
		t.Fatalf("past the bound: %v after %s", err, time.Since(start))
	}

	moved := &electing{redirect: "127.0.0.1:1"}
	if err := check(t, serve(t, moved), WaitOutElections(10*time.Second)); status.Code(err) != codes.Unavailable || moved.calls.Load() != 1 {
		t.Fatalf("a redirect: %v after %d calls; want it returned after 1", err, moved.calls.Load())
	}
}

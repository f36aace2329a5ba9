// Package kittest serves a driver for tests: the kit's gRPC service on 127.0.0.1 over a real
// server, with logs to t.Log, and a client for it.
package kittest

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// logWriter writes lines to t.Log until the test ends (operations may outlive a failed test).
type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Logger logs to t.Log at level until the test ends.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// Serve runs d behind the kit's FenceDriverService on 127.0.0.1 and returns its address and a client.
// Zero options get test defaults (a fresh state directory, 10 s deadline, 50 ms polls, logs to t.Log);
// everything stops when the test ends.
func Serve(t testing.TB, d kit.Driver, opts kit.Options) (string, driverv1.FenceDriverServiceClient) {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	if opts.DefaultTimeout == 0 {
		opts.DefaultTimeout = 10 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 50 * time.Millisecond
	}
	if opts.Log == nil {
		opts.Log = Logger(t, slog.LevelInfo)
	}
	svc, err := kit.NewService(d, opts)
	if err != nil {
		t.Fatalf("kit.NewService: %v", err)
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "spiffe://nodefence/coordinator/test", DrainTimeout: time.Second}, opts.Log)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)
	conn, err := dial.New(srv.Addr(), tlsfiles.Files{Insecure: true})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return srv.Addr(), driverv1.NewFenceDriverServiceClient(conn)
}

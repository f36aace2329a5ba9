package fencedriver

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/syncbuf"
)

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // every line must appear in stderr
	}{
		{
			name: "everything wrong",
			args: []string{"--driver", "snmp", "--default-timeout", "-1s", "--poll-interval", "0",
				"--listen", "nowhere", "--log-level", "loud", "extra"},
			want: []string{
				`--driver: unknown driver "snmp" (known: agent, aws, brocade, ipmi, pdu, redfish)`,
				"--state-dir: required",
				"--default-timeout: must be positive",
				"--poll-interval: must be positive",
				"--log-level:",
				`--listen: "nowhere" is not host:port`,
				"--tls-cert: required unless --insecure is set",
				"unexpected arguments",
			},
		},
		{
			name: "missing driver",
			args: []string{"--state-dir", "x", "--insecure"},
			want: []string{"--driver: required"},
		},
		{
			name: "poll slower than timeout",
			args: []string{"--driver", "ipmi", "--state-dir", "x", "--insecure", "--default-timeout", "1s", "--poll-interval", "2s"},
			want: []string{"--poll-interval: 2s must be shorter than --default-timeout 1s"},
		},
		{
			name: "undefined flag",
			args: []string{"--no-such-flag"},
			want: []string{"flag provided but not defined: -no-such-flag"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != 2 {
				t.Errorf("run = %d, want 2; stderr:\n%s", code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing (nothing started)", stdout.String())
			}
		})
	}
}

// running is fence-driver's run() serving in the background, with a client connection to it.
type running struct {
	conn   *grpc.ClientConn
	done   chan int
	stderr *syncbuf.Buffer
}

// startRun runs the binary's run() with args in the background and connects to the address it
// prints once it serves.
func startRun(t *testing.T, args ...string) running {
	t.Helper()
	var stdout syncbuf.Buffer
	r := running{done: make(chan int, 1), stderr: &syncbuf.Buffer{}}
	go func() { r.done <- run(args, &stdout, r.stderr) }()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; {
		if _, a, ok := strings.Cut(stdout.String(), " serving on "); ok {
			addr = strings.TrimSpace(a)
			break
		}
		select {
		case code := <-r.done:
			t.Fatalf("run exited %d: %s", code, r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving after 10s: %s", r.stderr.String())
		}
	}
	conn, err := dial.New(addr, tlsfiles.Files{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.conn = conn
	return r
}

func TestRunServesUntilSIGTERM(t *testing.T) {
	srv := startRun(t, "--driver", "ipmi", "--state-dir", t.TempDir(), "--insecure", "--unauthenticated-caller", "spiffe://nodefence/coordinator/test", "--listen", "127.0.0.1:0")
	conn, done, stderr := srv.conn, srv.done, srv.stderr
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "nodefence.driver.v1.FenceDriverService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}
	d, err := driverv1.NewFenceDriverServiceClient(conn).Describe(ctx, &driverv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("ipmi", d.GetDriver()); diff != "" {
		t.Errorf("driver (-want +got):\n%s", diff)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("run after SIGTERM = %d, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("run did not return after SIGTERM")
	}
}

package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// pki writes a CA, a server certificate for 127.0.0.1 and client certificates for an operator, a
// viewer, a monitoring scraper, an agent, a coordinator, and one without an identity.
type pki struct {
	dir, ca, serverCert, serverKey string
	clients                        map[string]tlsfiles.Files
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := certs.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{dir: dir, clients: map[string]tlsfiles.Files{}}
	if p.ca, _, err = ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(identity.Identity{Role: identity.Driver, Name: "test"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if p.serverCert, p.serverKey, err = srv.Write(dir, "server"); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]identity.Identity{
		"operator": {Role: identity.Operator, Name: "alice"}, "viewer": {Role: identity.Viewer, Name: "bob"},
		"monitoring": {Role: identity.Monitoring, Name: "prometheus"}, "agent": {Role: identity.Agent, Name: "n1"},
		"coordinator": {Role: identity.Coordinator, Name: "c1"},
	} {
		pair, err := ca.Issue(id, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, k, _ := pair.Write(dir, name)
		p.clients[name] = tlsfiles.Files{CertFile: c, KeyFile: k, CAFile: p.ca}
	}
	bare, err := ca.IssueURIs("no-identity", nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, k, _ := bare.Write(dir, "bare")
	p.clients["bare"] = tlsfiles.Files{CertFile: c, KeyFile: k, CAFile: p.ca}
	return p
}

// boomPolicy lets operators call the test service.
var boomPolicy = identity.Policy{"/test.Boom/Check": {identity.Operator}}

// boom is a tiny service whose handler panics, returns a domain error, or answers SERVING.
var boomDesc = grpc.ServiceDesc{
	ServiceName: "test.Boom",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Check",
		Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := new(healthpb.HealthCheckRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, r any) (any, error) {
				switch r.(*healthpb.HealthCheckRequest).Service {
				case "panic":
					panic("handler bug")
				case "notfound":
					return nil, fmt.Errorf("node x: %w", fault.ErrNotFound)
				case "internal":
					return nil, errors.New("disk on fire")
				case "foreign":
					// A status from elsewhere (here, shaped like one from etcd) returned as is.
					return nil, fmt.Errorf("put: %w", status.Error(codes.FailedPrecondition, "etcdserver: revision compacted"))
				}
				return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/test.Boom/Check"}, h)
		},
	}},
}

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.Policy == nil {
		cfg.Policy = boomPolicy
	}
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.GRPC.RegisterService(&boomDesc, struct{}{})
	go s.Serve()
	t.Cleanup(s.Stop)
	return s
}

func call(t *testing.T, addr string, files tlsfiles.Files, service string) error {
	t.Helper()
	conn, err := dial.New(addr, files)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return conn.Invoke(ctx, "/test.Boom/Check", &healthpb.HealthCheckRequest{Service: service}, new(healthpb.HealthCheckResponse))
}

func TestInterceptorsOverPlaintext(t *testing.T) {
	s := start(t, Config{TLS: tlsfiles.Files{Insecure: true}, MetricsListen: "127.0.0.1:0", UnauthenticatedCaller: "any"})
	files := tlsfiles.Files{Insecure: true}
	if err := call(t, s.Addr(), files, "panic"); status.Code(err) != codes.Internal || strings.Contains(err.Error(), "handler bug") {
		t.Fatalf("panic: %v, want Internal without the panic text", err)
	}
	if err := call(t, s.Addr(), files, "notfound"); status.Code(err) != codes.NotFound {
		t.Fatalf("domain error: %v, want NotFound", err)
	}
	if err := call(t, s.Addr(), files, "foreign"); status.Code(err) != codes.Internal || strings.Contains(err.Error(), "etcdserver") {
		t.Fatalf("foreign status: %v, want Internal without its message", err)
	}
	// The server is still alive after the panic; health answers.
	conn, _ := dial.New(s.Addr(), files)
	defer conn.Close()
	if r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `grpc_server_handled_total{grpc_code="Internal",grpc_method="Check",grpc_service="test.Boom",grpc_type="unary"} 2`) {
		t.Fatalf("metrics do not count the Internal error:\n%s", body)
	}
}

func TestMutualTLSAndAuthorization(t *testing.T) {
	p := newPKI(t)
	var seen []string
	s := start(t, Config{
		TLS: tlsfiles.Files{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca},
		Authorize: func(ctx context.Context, method string) error {
			seen = append(seen, identity.Name(ctx)+" "+method)
			return nil
		},
	})
	// Authorized: the call reaches the handler, whose domain error comes back mapped; the extra
	// check sees the certificate's identity.
	if err := call(t, s.Addr(), p.clients["operator"], "notfound"); status.Code(err) != codes.NotFound {
		t.Fatalf("operator: %v, want the handler's NotFound", err)
	}
	if len(seen) != 1 || seen[0] != "spiffe://nodefence/operator/alice /test.Boom/Check" {
		t.Fatalf("authorizer saw %v", seen)
	}
	// A role the policy does not name.
	if err := call(t, s.Addr(), p.clients["viewer"], "notfound"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer: %v, want PermissionDenied", err)
	}
	// A certificate from the CA but with no identity.
	if err := call(t, s.Addr(), p.clients["bare"], "notfound"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("certificate without identity: %v, want Unauthenticated", err)
	}
	// No client certificate: the handshake fails.
	if err := call(t, s.Addr(), tlsfiles.Files{CAFile: p.ca}, "notfound"); status.Code(err) != codes.Unavailable {
		t.Fatalf("no client cert: %v, want Unavailable (handshake refused)", err)
	}
	// Plaintext against a TLS server fails.
	if err := call(t, s.Addr(), tlsfiles.Files{Insecure: true}, "notfound"); err == nil || status.Code(err) == codes.NotFound {
		t.Fatalf("plaintext client reached the handler: %v", err)
	}
	if len(seen) != 1 {
		t.Fatalf("refused calls reached the extra check: %v", seen)
	}
}

// The extra check refuses with PermissionDenied.
func TestPermissionDenied(t *testing.T) {
	s := start(t, Config{TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "any",
		Authorize: func(context.Context, string) error { return fault.ErrPermissionDenied }})
	if err := call(t, s.Addr(), tlsfiles.Files{Insecure: true}, "notfound"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("%v, want PermissionDenied", err)
	}
}

// Without a certificate there is no identity: a plaintext server serves health and reflection,
// and nothing else unless told whom to trust.
func TestPlaintextHasNoIdentity(t *testing.T) {
	s := start(t, Config{TLS: tlsfiles.Files{Insecure: true}})
	plain := tlsfiles.Files{Insecure: true}
	if err := call(t, s.Addr(), plain, "notfound"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("plaintext caller: %v, want Unauthenticated", err)
	}
	conn, _ := dial.New(s.Addr(), plain)
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health: %v", err)
	}
	viewer := start(t, Config{TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "spiffe://nodefence/viewer/demo"})
	if err := call(t, viewer.Addr(), plain, "notfound"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("plaintext caller trusted as a viewer: %v, want PermissionDenied", err)
	}
}

// A server with a certificate but no client CA would accept anyone: it refuses to start unless
// told so explicitly.
func TestTLSWithoutClientCARefusedUnlessAllowed(t *testing.T) {
	p := newPKI(t)
	cfg := Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{CertFile: p.serverCert, KeyFile: p.serverKey}}
	if _, err := New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("New without --tls-ca = %v, want a refusal naming --tls-ca", err)
	}
	cfg.AllowUnauthenticatedClients = true
	s := start(t, cfg)
	if err := call(t, s.Addr(), tlsfiles.Files{CAFile: p.ca}, "notfound"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("client without certificate: %v, want Unauthenticated", err)
	}
	bad := Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca}, UnauthenticatedCaller: "spiffe://nodefence/root/x"}
	joined := fmt.Sprint(bad.Validate())
	for _, want := range []string{"has no effect with --tls-ca", "unknown role"} {
		if !strings.Contains(joined, want) {
			t.Errorf("Validate = %s, want %q", joined, want)
		}
	}
}

// The client sees a fixed message for an Internal error; the server log has its cause.
func TestInternalCauseLogged(t *testing.T) {
	var logged strings.Builder
	cfg := Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "any", Policy: boomPolicy}
	s, err := New(cfg, slog.New(slog.NewTextHandler(&syncWriter{b: &logged}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.GRPC.RegisterService(&boomDesc, struct{}{})
	go s.Serve()
	defer s.Stop()
	err = call(t, s.Addr(), tlsfiles.Files{Insecure: true}, "internal")
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("internal: %v, want Internal without the cause", err)
	}
	s.Stop()
	if !strings.Contains(logged.String(), "disk on fire") {
		t.Fatalf("the cause is not in the server log:\n%s", logged.String())
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	cfg := Config{Listen: "nope", MetricsListen: "also-nope", DrainTimeout: -time.Second}
	errs := cfg.Validate()
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"--listen", "--metrics-listen", "--drain-timeout", "--tls-cert: required unless --insecure"} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %q in:\n%s", want, joined)
		}
	}
}

// A busy stream is observed per call: authorized, logged and counted when it ends, but none of its
// messages reach the per-message Prometheus counters. The same stream on a server without the
// setting is observed per message.
func TestBusyStreamsAreObservedPerCall(t *testing.T) {
	const watch = "/grpc.health.v1.Health/Watch"
	for _, busy := range []bool{true, false} {
		t.Run(fmt.Sprint("busy=", busy), func(t *testing.T) {
			var logged strings.Builder
			cfg := Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}}
			if busy {
				cfg.BusyStreams = []string{watch}
			}
			s, err := New(cfg, slog.New(slog.NewTextHandler(&syncWriter{b: &logged}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			go s.Serve()
			defer s.Stop()
			conn, _ := dial.New(s.Addr(), tlsfiles.Files{Insecure: true})
			defer conn.Close()
			ctx, cancel := context.WithCancel(context.Background())
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("Watch: %v, %v", r, err)
			}
			cancel()
			perCall := `nodefence_grpc_busy_stream_handled_total{grpc_code="Canceled",grpc_method="Watch",grpc_service="grpc.health.v1.Health"} 1`
			perMessage := `grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 1`
			// The call's end is counted once the handler returns; grpcprom lists every code at 0 from
			// the start, so wait for the count this server should make.
			ended := perCall
			if !busy {
				ended = `grpc_server_handled_total{grpc_code="Canceled",grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 1`
			}
			metrics := ""
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				metrics = string(body)
				if strings.Contains(metrics, ended) || time.Now().After(deadline) {
					break
				}
			}
			if got := strings.Contains(metrics, perCall); got != busy {
				t.Errorf("per-call count present = %v, want %v:\n%s", got, busy, metrics)
			}
			if got := strings.Contains(metrics, perMessage); got == busy {
				t.Errorf("per-message count present = %v, want %v:\n%s", got, !busy, metrics)
			}
			s.Stop()
			if log := logged.String(); !strings.Contains(log, `msg="finished call"`) || !strings.Contains(log, "grpc.method=Watch") ||
				!strings.Contains(log, "grpc.method_type=server_stream") {
				t.Errorf("the call's end was not logged:\n%s", log)
			}
		})
	}
}

// syncWriter serializes writes from the server's goroutines into b.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

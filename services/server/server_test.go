package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client certificate (CN "operator").
type pki struct{ dir, ca, serverCert, serverKey, clientCert, clientKey string }

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p := pki{dir: dir, ca: filepath.Join(dir, "ca.crt")}
	writePEM(t, p.ca, "CERTIFICATE", caDER)
	issue := func(name string, serial int64, server bool) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
		if server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		cert, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		writePEM(t, cert, "CERTIFICATE", der)
		writePEM(t, keyPath, "EC PRIVATE KEY", keyDER)
		return cert, keyPath
	}
	p.serverCert, p.serverKey = issue("server", 2, true)
	p.clientCert, p.clientKey = issue("operator", 3, false)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

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
	s := start(t, Config{TLS: tlsfiles.Files{Insecure: true}, MetricsListen: "127.0.0.1:0"})
	files := tlsfiles.Files{Insecure: true}
	if err := call(t, s.Addr(), files, "panic"); status.Code(err) != codes.Internal || strings.Contains(err.Error(), "handler bug") {
		t.Fatalf("panic: %v, want Internal without the panic text", err)
	}
	if err := call(t, s.Addr(), files, "notfound"); status.Code(err) != codes.NotFound {
		t.Fatalf("domain error: %v, want NotFound", err)
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
	if !strings.Contains(string(body), `grpc_server_handled_total{grpc_code="Internal",grpc_method="Check",grpc_service="test.Boom",grpc_type="unary"} 1`) {
		t.Fatalf("metrics do not count the Internal error:\n%s", body)
	}
}

func TestMutualTLSAndAuthorization(t *testing.T) {
	p := newPKI(t)
	var seen []string
	s := start(t, Config{
		TLS: tlsfiles.Files{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca},
		Authorize: func(ctx context.Context, method string) error {
			seen = append(seen, PeerIdentity(ctx)+" "+method)
			if method == "/test.Boom/Check" && PeerIdentity(ctx) != "operator" {
				return fault.ErrPermissionDenied
			}
			return nil
		},
	})
	client := tlsfiles.Files{CertFile: p.clientCert, KeyFile: p.clientKey, CAFile: p.ca}
	// Authorized: the call reaches the handler, whose domain error comes back mapped.
	if err := call(t, s.Addr(), client, "notfound"); status.Code(err) != codes.NotFound {
		t.Fatalf("mTLS client: %v, want the handler's NotFound", err)
	}
	if len(seen) != 1 || seen[0] != "operator /test.Boom/Check" {
		t.Fatalf("authorizer saw %v", seen)
	}
	// No client certificate: the handshake fails.
	if err := call(t, s.Addr(), tlsfiles.Files{CAFile: p.ca}, "notfound"); status.Code(err) != codes.Unavailable {
		t.Fatalf("no client cert: %v, want Unavailable (handshake refused)", err)
	}
	// Plaintext against a TLS server fails.
	if err := call(t, s.Addr(), tlsfiles.Files{Insecure: true}, "notfound"); err == nil || status.Code(err) == codes.NotFound {
		t.Fatalf("plaintext client reached the handler: %v", err)
	}
}

func TestPermissionDenied(t *testing.T) {
	s := start(t, Config{TLS: tlsfiles.Files{Insecure: true}, Authorize: func(context.Context, string) error { return fault.ErrPermissionDenied }})
	if err := call(t, s.Addr(), tlsfiles.Files{Insecure: true}, "notfound"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("%v, want PermissionDenied", err)
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
			var authorized []string
			cfg := Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true},
				Authorize: func(_ context.Context, m string) error { authorized = append(authorized, m); return nil }}
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
			if len(authorized) != 1 || authorized[0] != watch {
				t.Errorf("authorized %v, want [%s]", authorized, watch)
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

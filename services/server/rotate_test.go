package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Certificates and the CA are rotated under a running server and a long-lived client reloader,
// over real gRPC on TCP with mutual TLS: both leaves renewed, then a CA rollover (bundle of the old
// and the new CA, every leaf re-issued by the new CA, then the new CA alone). Every call on a new
// connection succeeds throughout, each side presents the files' certificate, a client of the old
// CA is refused once the bundle drops it, a half-written file keeps the last good material and is
// counted, and nodefence_certificate_expiry_seconds follows the files. SIGHUP's Recheck makes the
// reloaders read the files at once.
func TestCertificatesAndCARotateUnderARunningServer(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(path(name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newCA := func(name string) *certs.CA {
		t.Helper()
		ca, err := certs.NewCA(name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return ca
	}
	srvID, cliID := identity.Identity{Role: identity.Driver, Name: "test"}, identity.Identity{Role: identity.Coordinator, Name: "c1"}
	issue := func(ca *certs.CA, id identity.Identity, base string, validity time.Duration) string {
		t.Helper()
		pair, err := ca.Issue(id, []string{"127.0.0.1"}, validity)
		if err != nil {
			t.Fatal(err)
		}
		write(base+".crt", pair.CertPEM)
		write(base+".key", pair.KeyPEM)
		leaf, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Leaf.SerialNumber.String()
	}
	old := newCA("old CA")
	write("ca.crt", old.CertPEM)
	issue(old, srvID, "server", time.Hour)
	issue(old, cliID, "client", time.Hour)
	serverFiles := tlsfiles.Files{CertFile: path("server.crt"), KeyFile: path("server.key"), CAFile: path("ca.crt")}
	clientFiles := tlsfiles.Files{CertFile: path("client.crt"), KeyFile: path("client.key"), CAFile: path("ca.crt")}

	srv, err := New(Config{Listen: "127.0.0.1:0", TLS: serverFiles, DrainTimeout: time.Second}, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)
	client, err := clientFiles.Reloader()
	if err != nil {
		t.Fatal(err)
	}
	// call makes a new connection with the long-lived client reloader, checks the server's
	// identity, and returns the serial of the certificate the server presented.
	call := func(step string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var presented string
		conn, err := dial.New(srv.Addr(), clientFiles, dial.Certs(client), dial.Peer(identity.Driver, "test"),
			dial.OnRefused(func(err error) { t.Errorf("%s: %v", step, err) }))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("%s: a call on a new connection failed: %v", step, err)
		}
		c, err := tls.Dial("tcp", srv.Addr(), client.ClientConfig("127.0.0.1", nil))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		defer c.Close()
		presented = c.ConnectionState().PeerCertificates[0].SerialNumber.String()
		return presented
	}
	expiry := func(role string) float64 {
		t.Helper()
		mfs, err := srv.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "nodefence_certificate_expiry_seconds" && m.GetLabel()[0].GetValue() == role {
					return m.GetGauge().GetValue()
				}
				if mf.GetName() == "nodefence_certificate_reload_failures_total" && role == "failures" {
					return m.GetCounter().GetValue()
				}
			}
		}
		t.Fatalf("no %s metric", role)
		return 0
	}

	call("start")
	// --tls-server-name is the name verified: a name the certificate does not carry fails.
	for name, ok := range map[string]bool{"127.0.0.1": true, "other.example": false} {
		f := clientFiles
		f.ServerName = name
		conn, err := dial.New(srv.Addr(), f, dial.Certs(client))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		conn.Close()
		if (err == nil) != ok {
			t.Fatalf("server name %s: %v, want success %v", name, err, ok)
		}
	}
	// Renewal by the same CA; the server's new certificate is valid for two hours.
	want := issue(old, srvID, "server", 2*time.Hour)
	issue(old, cliID, "client", 2*time.Hour)
	tlsfiles.Recheck()
	if got := call("renewed leaves"); got != want {
		t.Fatalf("after the renewal the server presents %s, want %s", got, want)
	}
	if e := expiry(tlsfiles.RoleServing); e < 1.5*3600 || e > 2*3600 {
		t.Fatalf("serving expiry %.0f s after the renewal, want about two hours", e)
	}
	// A half-written certificate: the last good pair stays, the failure is counted once.
	write("server.crt", []byte("-----BEGIN CERTIFICATE-----\nhalf"))
	for range 2 { // counted once it is still broken at the next check
		tlsfiles.Recheck()
		if got := call("half-written server certificate"); got != want {
			t.Fatalf("while the file is broken the server presents %s, want the last good %s", got, want)
		}
	}
	if f := expiry("failures"); f != 1 {
		t.Fatalf("reload failures = %v, want 1", f)
	}

	// CA rollover: the bundle trusts both, then every leaf moves to the new CA, then the old CA goes.
	next := newCA("new CA")
	write("ca.crt", append(append(append([]byte{}, old.CertPEM...), '\n'), next.CertPEM...))
	tlsfiles.Recheck()
	call("bundle of both CAs")
	want = issue(next, srvID, "server", time.Hour)
	tlsfiles.Recheck()
	if got := call("server of the new CA"); got != want {
		t.Fatalf("server of the new CA presents %s, want %s", got, want)
	}
	oldClient := tlsfiles.Files{CertFile: path("old-client.crt"), KeyFile: path("old-client.key"), CAFile: path("ca.crt")}
	issue(old, cliID, "old-client", time.Hour)
	stale, err := oldClient.Reloader()
	if err != nil {
		t.Fatal(err)
	}
	issue(next, cliID, "client", time.Hour)
	tlsfiles.Recheck()
	call("client of the new CA")
	write("ca.crt", next.CertPEM)
	tlsfiles.Recheck()
	call("the new CA alone")
	if e := expiry(tlsfiles.RoleServing + "-ca"); e < 0.9*3600 || e > 3600 {
		t.Fatalf("serving CA expiry %.0f s, want about an hour", e)
	}
	// A client still holding a certificate of the old CA is refused now.
	c, err := tls.Dial("tcp", srv.Addr(), stale.ClientConfig("127.0.0.1", nil))
	if err == nil {
		// TLS 1.3 reports the client certificate's rejection on the first read.
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil {
		t.Fatal("a client certificate of the dropped CA was accepted")
	}
}

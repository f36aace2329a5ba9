package dial

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

type serving struct {
	healthpb.UnimplementedHealthServer
}

func (serving) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serveTLS serves health checks on 127.0.0.1 with pair, asking every client for a certificate of ca.
func serveTLS(t *testing.T, pair certs.Pair, ca *certs.CA) string {
	t.Helper()
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})))
	healthpb.RegisterHealthServer(s, serving{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// An agent's certificate names the agent (and a Service name), not its node's address: dialled at
// that address, it fails the usual name check, and passes ByIdentity only with the expected identity
// and a chain to the CA.
func TestByIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile, _, err := ca.WriteCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *certs.CA, name string) certs.Pair {
		p, err := ca.Issue(identity.Identity{Role: identity.Agent, Name: name}, []string{"nodefence-node-agent.nodefence.svc"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	client := tlsfiles.Files{CAFile: caFile}
	if client.CertFile, client.KeyFile, err = issue(ca, "a").Write(dir, "agent-a"); err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peerB := serveTLS(t, issue(ca, "b"), ca)
	impostor := serveTLS(t, issue(other, "b"), ca)

	call := func(addr string, opts ...Option) error {
		cc, err := New(addr, client, opts...)
		if err != nil {
			return err
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
		return err
	}
	if err := call(peerB, Peer(identity.Agent, "b")); err == nil {
		t.Error("the address's name check passed a certificate without that address")
	}
	if err := call(peerB, Peer(identity.Agent, "b"), ByIdentity()); err != nil {
		t.Errorf("agent/b by its identity: %v", err)
	}
	if err := call(peerB, Peer(identity.Agent, "c"), ByIdentity()); err == nil {
		t.Error("agent/b accepted where agent/c was expected")
	}
	if err := call(impostor, Peer(identity.Agent, "b"), ByIdentity()); err == nil {
		t.Error("a certificate of another CA accepted by identity")
	}
	if _, err := New(peerB, client, ByIdentity()); err == nil {
		t.Error("ByIdentity without Peer accepted")
	}
}

package app

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/pki"
)

// cert-manager renews the coordinator's certificate by rewriting its files: the admission and
// authorization webhooks present the new certificate from the next connection once a check is due
// (before, the webhook served the certificate it started with until it expired, and the apiserver,
// failing closed, refused every agent eviction and Event and every list of pods the webhook judges).
func TestAdmissionWebhookServesTheRenewedCertificate(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	a := &App{cfg: Config{AdmissionListen: "127.0.0.1:0", AdmissionAgentUser: DefaultAdmissionAgentUser,
		Server: server.Config{TLS: files}, Now: func() time.Time { return now }},
		log:  slog.New(slog.NewTextHandler(t.Output(), nil)),
		kube: &kubeMode{core: kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"})}} // never asked here
	if err := a.listenAdmission(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.admission.serve() }()
	t.Cleanup(a.admission.close)
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(p.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	presented := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", a.AdmissionAddr(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := presented()
	pair, err := p.CA.Issue(identity.Identity{Role: identity.Coordinator, Name: "c1"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pair.Write(p.Dir, "coordinator-c1"); err != nil { // the files the flags name
		t.Fatal(err)
	}
	renewed, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(renewed.Certificate[0])
	now = now.Add(tlsfiles.DefaultReloadCheck)
	if got := presented(); got != leaf.SerialNumber.String() || got == first {
		t.Fatalf("after the renewal the webhook presents serial %s (first %s), want the renewed %s", got, first, leaf.SerialNumber)
	}
}

package metrics

import (
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/pki"
)

type certStream struct{ r *tlsfiles.Reloader }

func (certStream) Connected() bool             { return true }
func (certStream) Unacked() int                { return 0 }
func (s certStream) Certs() *tlsfiles.Reloader { return s.r }

// The agent's metrics report the expiry of the certificate it dials the coordinator with, and of
// the newest CA it verifies the coordinator with.
func TestAgentReportsItsCertificateExpiry(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := files.Reloader()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := New(certStream{r}).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "nodefence_certificate_expiry_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	day := (24 * time.Hour).Seconds()
	if got["client"] < day-600 || got["client"] > day || got["client-ca"] < day-600 || got["client-ca"] > day {
		t.Fatalf("nodefence_certificate_expiry_seconds = %v; want client and client-ca about a day (the test PKI's lifetime)", got)
	}
}

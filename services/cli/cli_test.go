package cli

import (
	"crypto/tls"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"
)

// SIGHUP does not end a process of SignalContext: it makes every TLS reloader read its files at
// once, however long its check interval.
func TestSIGHUPRereadsTheTLSFiles(t *testing.T) {
	ctx, cancel := SignalContext()
	defer cancel()
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := files.Reloader()
	if err != nil {
		t.Fatal(err)
	}
	r.CheckEvery = time.Hour
	serving := func() string {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}
	first := serving()
	pair, err := p.CA.Issue(identity.Identity{Role: identity.Coordinator, Name: "c1"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pair.Write(p.Dir, "coordinator-c1"); err != nil {
		t.Fatal(err)
	}
	renewed, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if got := serving(); got != first {
		t.Fatal("read the files again before the check interval without a SIGHUP")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for serving() != renewed.Leaf.SerialNumber.String() {
		if time.Now().After(deadline) {
			t.Fatal("after SIGHUP: still the first certificate")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatal("SIGHUP cancelled the context")
	}
}

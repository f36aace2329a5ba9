package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/pki"
)

// The certificate files are replaced (cert-manager renewed the certificate): the reloader serves
// the new pair once a check is due and the files changed, keeps the last good pair while the files
// do not load (reporting it once), and takes the next good pair.
func TestReloaderFollowsTheFiles(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := tlsfiles.NewReloader(files.CertFile, files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	r.Now, r.CheckEvery = func() time.Time { return now }, 10*time.Second
	var errs []error
	r.OnError = func(err error) { errs = append(errs, err) }
	serial := func() string {
		t.Helper()
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.String()
	}
	renew := func() string {
		t.Helper()
		pair, err := p.CA.Issue(identity.Identity{Role: identity.Coordinator, Name: "c1"}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(files.CertFile, pair.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(files.KeyFile, pair.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		leaf, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(leaf.Certificate[0])
		return c.SerialNumber.String()
	}

	first := serial()
	second := renew()
	if got := serial(); got != first {
		t.Fatalf("served %s before a check was due, want the loaded %s", got, first)
	}
	now = now.Add(10 * time.Second)
	if got := serial(); got != second {
		t.Fatalf("after the files changed: serving %s, want the new %s", got, second)
	}
	// A half-written pair: the key is not yet the certificate's.
	if err := os.WriteFile(files.KeyFile, []byte("-----BEGIN PRIVATE KEY-----\nnot yet\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		now = now.Add(10 * time.Second)
		if got := serial(); got != second {
			t.Fatalf("while the files do not load: serving %s, want the last good %s", got, second)
		}
	}
	if len(errs) != 1 {
		t.Fatalf("errors reported: %v; want one for the one bad change", errs)
	}
	third := renew()
	now = now.Add(10 * time.Second)
	if got := serial(); got != third || r.Loads() != 3 {
		t.Fatalf("after the next good pair: serving %s (loads %d), want %s (3)", got, r.Loads(), third)
	}
	if _, err := tlsfiles.NewReloader(files.CertFile, files.CertFile); err == nil {
		t.Fatal("a certificate as its own key loaded")
	}
	if _, err := tlsfiles.NewReloader(files.CertFile+".missing", files.KeyFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// The CA bundle is followed like the pair: a bundle of two CAs trusts both, a half-written bundle
// keeps the last good one (reported and counted once), and Recheck (SIGHUP) reads the files before
// CheckEvery has passed.
func TestReloaderFollowsTheCABundle(t *testing.T) {
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
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	r.Now = func() time.Time { return now }
	var errs []error
	r.OnError = func(err error) { errs = append(errs, err) }
	other, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherLeaf, err := other.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	trusts := func(f tlsfiles.Files) bool {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: r.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}
	if !trusts(files) || trusts(otherLeaf) {
		t.Fatal("the first bundle: want the own CA trusted, the other not")
	}
	both := append(append(append([]byte{}, p.CA.CertPEM...), '\n'), other.CA.CertPEM...)
	if err := os.WriteFile(files.CAFile, both, 0o644); err != nil {
		t.Fatal(err)
	}
	if trusts(otherLeaf) {
		t.Fatal("the bundle was read again before a check was due")
	}
	tlsfiles.Recheck()
	if !trusts(files) || !trusts(otherLeaf) {
		t.Fatal("after Recheck: want both CAs trusted")
	}
	if err := os.WriteFile(files.CAFile, other.CA.CertPEM[:len(other.CA.CertPEM)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		now = now.Add(time.Second)
		if !trusts(files) || !trusts(otherLeaf) {
			t.Fatal("a half-written bundle replaced the last good one")
		}
	}
	if len(errs) != 1 || r.Failures() != 1 {
		t.Fatalf("errors %v, failures %d; want one each", errs, r.Failures())
	}
	if err := os.WriteFile(files.CAFile, other.CA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if trusts(files) || !trusts(otherLeaf) {
		t.Fatal("the new CA alone: want only it trusted")
	}
	if _, ca := r.Expiry(); !ca.Equal(other.CA.Cert.NotAfter) {
		t.Fatalf("CA expiry %v, want %v", ca, other.CA.Cert.NotAfter)
	}
}

// A certificate copied a moment before its key fails to load at one check and loads at the next:
// no error, no failure counted, the new pair taken.
func TestReloaderForgivesAPairCopiedInTwoSteps(t *testing.T) {
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
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	r.Now = func() time.Time { return now }
	r.OnError = func(err error) { t.Errorf("reported: %v", err) }
	serving := func() string {
		t.Helper()
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
	if err := os.WriteFile(files.CertFile, pair.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if serving() != first {
		t.Fatal("took a certificate without its key")
	}
	if err := os.WriteFile(files.KeyFile, pair.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if got := serving(); got == first || r.Failures() != 0 {
		t.Fatalf("after the key: serving %s (first %s), failures %d; want the new one, none", got, first, r.Failures())
	}
}

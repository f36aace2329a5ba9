package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Reloader holds the TLS material of one endpoint — its certificate and key, and the CA bundle
// that verifies its peers — read from files and read again when they change: cert-manager renews
// a certificate by rewriting its Secret, the kubelet swaps the files of a mounted Secret in place,
// and an operator rolls a CA over by first shipping a bundle with both CAs; a process that loaded
// its files once would present the old certificate until it expires and trust only the old CA.
//
// The files are compared with what was loaded (their contents: a few kilobytes, read at most once
// per CheckEvery, on a handshake or a metrics scrape; at once after Recheck, which SIGHUP calls).
// A changed piece that does not load (half written, key and certificate not matching, a bundle
// with no certificate or an unparsable one) keeps the last good one; OnError hears why, once per
// change that is still there at the next check, and Failures counts it. The certificate pair and
// the CA bundle are taken independently.
type Reloader struct {
	files Files
	// CheckEvery is the least time between two reads of the files (DefaultReloadCheck).
	CheckEvery time.Duration
	// Now is the clock the checks are paced by; nil means time.Now.
	Now func() time.Time
	// OnError, if set, hears of a changed file that could not be loaded at two checks in a row,
	// once per change.
	OnError func(error)
	// OnLoad, if set, hears of every change taken (a new pair or a new bundle). OnError and OnLoad
	// run while the reloader is locked: they must not call its methods.
	OnLoad func()

	mu         sync.Mutex
	pair       *tls.Certificate // nil when no certificate is configured
	pool       *x509.CertPool   // nil when no CA bundle is configured
	caNotAfter time.Time        // the latest NotAfter of the bundle's CAs
	certPEM    []byte
	keyPEM     []byte
	caPEM      []byte
	badPair    badFiles
	badCA      badFiles
	checked    time.Time
	gen        uint64 // the Recheck generation of the last check
	loads      int
	failures   int
}

// DefaultReloadCheck is Reloader.CheckEvery's default.
const DefaultReloadCheck = time.Second

// recheck is bumped by Recheck: every Reloader reads its files at its next use.
var recheck atomic.Uint64

// Recheck makes every Reloader of the process read its files at its next use (a handshake or a
// scrape), whatever its CheckEvery: the SIGHUP of cli.SignalContext calls it.
func Recheck() { recheck.Add(1) }

// NewReloader loads a certificate and key once; it fails when the files do not hold a valid pair.
func NewReloader(certFile, keyFile string) (*Reloader, error) {
	return Files{CertFile: certFile, KeyFile: keyFile}.Reloader()
}

// Reloader loads f's certificate and key (when set) and CA bundle (when set) once; it fails when
// they do not load, as a process should not start with material it cannot use.
func (f Files) Reloader() (*Reloader, error) {
	r := &Reloader{files: f, gen: recheck.Load(), loads: 1}
	if f.CertFile != "" || f.KeyFile != "" {
		c, k, err := r.readPair()
		if err != nil {
			return nil, err
		}
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			return nil, fmt.Errorf("load certificate %s: %w", f.CertFile, err)
		}
		r.pair, r.certPEM, r.keyPEM = &pair, c, k
	}
	if f.CAFile != "" {
		b, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		pool, notAfter, err := parseBundle(b)
		if err != nil {
			return nil, fmt.Errorf("CA bundle %s: %w", f.CAFile, err)
		}
		r.pool, r.caNotAfter, r.caPEM = pool, notAfter, b
	}
	return r, nil
}

func (r *Reloader) readPair() (cert, key []byte, err error) {
	if cert, err = os.ReadFile(r.files.CertFile); err != nil {
		return nil, nil, fmt.Errorf("read certificate: %w", err)
	}
	if key, err = os.ReadFile(r.files.KeyFile); err != nil {
		return nil, nil, fmt.Errorf("read key: %w", err)
	}
	return cert, key, nil
}

// parseBundle reads every CERTIFICATE block of a PEM bundle. Anything else than whitespace and
// certificates (a half-written file) makes it fail, so that a bundle is taken whole or not at all.
func parseBundle(b []byte) (*x509.CertPool, time.Time, error) {
	pool := x509.NewCertPool()
	var latest time.Time
	n := 0
	for rest := b; len(bytes.TrimSpace(rest)) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, time.Time{}, errors.New("data that is not a PEM block")
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		if c.NotAfter.After(latest) {
			latest = c.NotAfter
		}
		n++
	}
	if n == 0 {
		return nil, time.Time{}, errors.New("no PEM certificates found")
	}
	return pool, latest, nil
}

// refresh reads the files again when a check is due; r.mu is held.
func (r *Reloader) refresh() {
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	every := r.CheckEvery
	if every <= 0 {
		every = DefaultReloadCheck
	}
	t, g := now(), recheck.Load()
	if since := t.Sub(r.checked); !r.checked.IsZero() && since >= 0 && since < every && g == r.gen {
		return
	}
	r.checked, r.gen = t, g
	if r.pair != nil {
		r.reloadPair()
	}
	if r.pool != nil {
		r.reloadBundle()
	}
}

// reloadPair takes the certificate and key when they changed and load.
func (r *Reloader) reloadPair() {
	c, k, err := r.readPair()
	if err == nil && bytes.Equal(c, r.certPEM) && bytes.Equal(k, r.keyPEM) {
		return
	}
	if err == nil {
		var pair tls.Certificate
		if pair, err = tls.X509KeyPair(c, k); err == nil {
			r.pair, r.certPEM, r.keyPEM, r.badPair = &pair, c, k, badFiles{}
			r.loaded()
			return
		}
	}
	r.fail(&r.badPair, append(append([]byte{}, c...), k...), fmt.Errorf("%s, %s changed but do not load; still using the previous certificate: %w", r.files.CertFile, r.files.KeyFile, err))
}

// reloadBundle takes the CA bundle when it changed and loads.
func (r *Reloader) reloadBundle() {
	b, err := os.ReadFile(r.files.CAFile)
	if err == nil && bytes.Equal(b, r.caPEM) {
		return
	}
	if err == nil {
		var pool *x509.CertPool
		var notAfter time.Time
		if pool, notAfter, err = parseBundle(b); err == nil {
			r.pool, r.caNotAfter, r.caPEM, r.badCA = pool, notAfter, b, badFiles{}
			r.loaded()
			return
		}
	}
	r.fail(&r.badCA, b, fmt.Errorf("CA bundle %s changed but does not load; still trusting the previous one: %w", r.files.CAFile, err))
}

func (r *Reloader) loaded() {
	r.loads++
	if r.OnLoad != nil {
		r.OnLoad()
	}
}

// badFiles are the contents of changed files that did not load, and at how many checks in a row.
type badFiles struct {
	content []byte
	checks  int
}

// fail counts and reports err when the same contents failed at a second check in a row: a
// certificate copied before its key fails once, for a moment, and is no fault; a file that
// stays broken is reported once.
func (r *Reloader) fail(bad *badFiles, content []byte, err error) {
	if content == nil {
		content = []byte{}
	}
	if bad.content != nil && bytes.Equal(content, bad.content) {
		bad.checks++
	} else {
		bad.content, bad.checks = content, 1
	}
	if bad.checks != 2 {
		return
	}
	r.failures++
	if r.OnError != nil {
		r.OnError(err)
	}
}

// GetCertificate is tls.Config.GetCertificate: the current pair, read again first when a check is
// due and the files changed.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	if r.pair == nil {
		return nil, errors.New("no certificate configured")
	}
	return r.pair, nil
}

// GetClientCertificate is tls.Config.GetClientCertificate: the current pair (none when no
// certificate is configured).
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	if r.pair == nil {
		return &tls.Certificate{}, nil
	}
	return r.pair, nil
}

// Pool is the current CA bundle (nil when none is configured).
func (r *Reloader) Pool() *x509.CertPool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	return r.pool
}

// Expiry is the NotAfter of the current certificate and the latest NotAfter of the current CA
// bundle; zero for what is not configured.
func (r *Reloader) Expiry() (cert, ca time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	if r.pair != nil && r.pair.Leaf != nil {
		cert = r.pair.Leaf.NotAfter
	}
	return cert, r.caNotAfter
}

// Loads is how many times the reloader has taken new material (the first load counts one).
func (r *Reloader) Loads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loads
}

// Failures is how many changed files could not be loaded (each change counted once).
func (r *Reloader) Failures() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures
}

// ServerConfig is a server's TLS configuration over the reloader: every handshake presents the
// current certificate and, when a CA bundle is configured, requires a client certificate that the
// current bundle verifies. nextProtos are the ALPN protocols to offer ("h2" for gRPC), as the
// configuration a handshake gets is built here, not from the caller's copy.
func (r *Reloader) ServerConfig(nextProtos ...string) *tls.Config {
	// No session tickets: a resumed session skips the client's certificate, which must be verified
	// by the bundle as it is at every connection (a CA dropped from the bundle is distrusted at once).
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, GetCertificate: r.GetCertificate, SessionTicketsDisabled: true}
	if r.files.CAFile != "" {
		base.ClientAuth = tls.RequireAndVerifyClientCert
	}
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = r.Pool()
		return c, nil
	}
	return cfg
}

// ServerReloading is Server, except that the certificate (and the CA bundle, when set) come from
// a Reloader of the files (returned too, for its settings). It returns nil, nil, nil when Insecure.
func (f Files) ServerReloading() (*tls.Config, *Reloader, error) {
	if f.Insecure {
		return nil, nil, nil
	}
	r, err := f.Reloader()
	if err != nil {
		return nil, nil, err
	}
	return r.ServerConfig(), r, nil
}

// Watch is Reloader for a running component: nil, nil when Insecure; every change that does not
// load is logged (log may be nil) naming what the files are for, and every reload that took new
// material at Info level on the next use.
func (f Files) Watch(log *slog.Logger, what string) (*Reloader, error) {
	if f.Insecure {
		return nil, nil
	}
	r, err := f.Reloader()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if log != nil {
		r.OnError = func(err error) { log.Error("TLS files not reloaded", "for", what, "err", err) }
		r.OnLoad = func() { log.Info("TLS files reloaded", "for", what, "cert", f.CertFile, "ca", f.CAFile) }
	}
	return r, nil
}

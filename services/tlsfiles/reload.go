package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// Reloader serves a certificate and key from files and reads them again when they change:
// cert-manager renews a certificate by rewriting its Secret, and the kubelet swaps the files of a
// mounted Secret in place, so a server that loaded its certificate once would present the old one
// until it expires. The files are compared with what was loaded at most once per CheckEvery (on a
// handshake); a pair that does not load (half written, key and certificate not matching) keeps
// the last good one, and OnError hears why.
type Reloader struct {
	certFile, keyFile string
	// CheckEvery is the least time between two reads of the files (DefaultReloadCheck).
	CheckEvery time.Duration
	// Now is the clock the checks are paced by; nil means time.Now.
	Now func() time.Time
	// OnError, if set, hears of a changed pair that could not be loaded, once per change.
	OnError func(error)

	mu      sync.Mutex
	pair    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
	badCert []byte // the certificate of the last pair that failed, reported once
	checked time.Time
	loads   int
}

// DefaultReloadCheck is Reloader.CheckEvery's default.
const DefaultReloadCheck = 10 * time.Second

// NewReloader loads the pair once; it fails when the files do not hold a valid pair.
func NewReloader(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	c, k, err := r.read()
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	r.pair, r.certPEM, r.keyPEM, r.loads = &pair, c, k, 1
	return r, nil
}

func (r *Reloader) read() (cert, key []byte, err error) {
	if cert, err = os.ReadFile(r.certFile); err != nil {
		return nil, nil, fmt.Errorf("read certificate: %w", err)
	}
	if key, err = os.ReadFile(r.keyFile); err != nil {
		return nil, nil, fmt.Errorf("read key: %w", err)
	}
	return cert, key, nil
}

// GetCertificate is tls.Config.GetCertificate: the current pair, read again first when the last
// check is CheckEvery old and the files changed.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	every := r.CheckEvery
	if every <= 0 {
		every = DefaultReloadCheck
	}
	if t := now(); r.checked.IsZero() || t.Sub(r.checked) >= every {
		r.checked = t
		r.reload()
	}
	return r.pair, nil
}

// reload reads the files and takes the pair when it changed and loads.
func (r *Reloader) reload() {
	c, k, err := r.read()
	if err == nil && bytes.Equal(c, r.certPEM) && bytes.Equal(k, r.keyPEM) {
		return
	}
	if err == nil {
		var pair tls.Certificate
		if pair, err = tls.X509KeyPair(c, k); err == nil {
			r.pair, r.certPEM, r.keyPEM, r.badCert = &pair, c, k, nil
			r.loads++
			return
		}
	}
	if r.OnError != nil && !bytes.Equal(c, r.badCert) {
		r.OnError(fmt.Errorf("%s, %s changed but do not load; still serving the previous certificate: %w", r.certFile, r.keyFile, err))
	}
	r.badCert = c
}

// Loads is how many pairs the reloader has loaded (the first one included).
func (r *Reloader) Loads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loads
}

// ServerReloading is Server, except that the server's own certificate comes from a Reloader of
// the files (returned too, for its settings). It returns nil, nil, nil when Insecure.
func (f Files) ServerReloading() (*tls.Config, *Reloader, error) {
	if f.Insecure {
		return nil, nil, nil
	}
	cfg, err := f.Server()
	if err != nil {
		return nil, nil, err
	}
	r, err := NewReloader(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, nil, err
	}
	cfg.Certificates, cfg.GetCertificate = nil, r.GetCertificate
	return cfg, r, nil
}

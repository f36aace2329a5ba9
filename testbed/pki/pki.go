// Package pki gives tests, benchmarks and the testbed a real certificate authority: one CA per
// directory and a certificate per component with its nodefence identity (package identity), so
// that everything runs with mutual TLS as in production.
package pki

import (
	"fmt"
	"sync"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// PKI is a CA whose files live in Dir.
type PKI struct {
	// Dir holds ca.crt and every issued <role>-<name>.crt/.key.
	Dir string
	// CAFile is the CA bundle every component verifies its peers with.
	CAFile string
	// CA signs the certificates.
	CA *certs.CA

	mu     sync.Mutex
	issued map[identity.Identity]tlsfiles.Files
}

// New creates a CA in dir.
func New(dir string) (*PKI, error) {
	ca, err := certs.NewCA("nodefence test CA", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	caFile, _, err := ca.WriteCA(dir)
	if err != nil {
		return nil, err
	}
	return &PKI{Dir: dir, CAFile: caFile, CA: ca, issued: map[identity.Identity]tlsfiles.Files{}}, nil
}

// Files returns the TLS files of role/name (issued once, for 127.0.0.1 and localhost).
func (p *PKI) Files(role identity.Role, name string) (tlsfiles.Files, error) {
	id := identity.Identity{Role: role, Name: name}
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.issued[id]; ok {
		return f, nil
	}
	pair, err := p.CA.Issue(id, []string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		return tlsfiles.Files{}, fmt.Errorf("issue %s: %w", id, err)
	}
	c, k, err := pair.Write(p.Dir, string(role)+"-"+name)
	if err != nil {
		return tlsfiles.Files{}, err
	}
	f := tlsfiles.Files{CertFile: c, KeyFile: k, CAFile: p.CAFile}
	p.issued[id] = f
	return f, nil
}

// Args are the command-line flags for files, with the flag prefix ("" or "driver-").
func Args(prefix string, f tlsfiles.Files) []string {
	return []string{"--" + prefix + "tls-cert", f.CertFile, "--" + prefix + "tls-key", f.KeyFile, "--" + prefix + "tls-ca", f.CAFile}
}

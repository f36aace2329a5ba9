// Package certs issues the X.509 certificates of a nodefence installation: one CA, and per
// component a certificate carrying its identity as a URI SAN (package identity). fencectl's
// `certs` command and the testbed use it; production installations may use any CA that writes the
// same URI SANs (cert-manager, SPIRE, step-ca).
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/nodefence/nodefence/services/identity"
)

// CA is a certificate authority with its key in memory.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// CertPEM is Cert in PEM, the bundle every component verifies its peers with.
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// Pair is one issued certificate and its private key, in PEM.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA creates a self-signed CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// LoadCA reads a CA certificate and its key (as written by WriteCA).
func LoadCA(certFile, keyFile string) (*CA, error) {
	cpem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	kpem, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(cpem)
	kb, _ := pem.Decode(kpem)
	if cb == nil || kb == nil {
		return nil, errors.New("CA certificate or key: no PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	return &CA{Cert: cert, CertPEM: cpem, key: key}, nil
}

// KeyPEM is the CA's private key in PEM.
func (ca *CA) KeyPEM() []byte {
	der, _ := x509.MarshalECPrivateKey(ca.key)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// Issue signs a certificate for id, usable as client and as server; hosts (DNS names or IP
// addresses) are the names a server certificate answers to.
func (ca *CA) Issue(id identity.Identity, hosts []string, validity time.Duration) (Pair, error) {
	if err := id.Validate(); err != nil {
		return Pair{}, err
	}
	u, err := url.Parse(id.String())
	if err != nil {
		return Pair{}, err
	}
	return ca.IssueURIs(string(id.Role)+"/"+id.Name, []*url.URL{u}, hosts, validity)
}

// IssueURIs signs a certificate with exactly the given URI SANs, unchecked. Tests use it to
// present certificates the identity rules must refuse.
func (ca *CA) IssueURIs(commonName string, uris []*url.URL, hosts []string, validity time.Duration) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        uris,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// WriteCA writes ca.crt and ca.key (0600) into dir.
func (ca *CA) WriteCA(dir string) (certFile, keyFile string, err error) {
	return writePair(dir, "ca", Pair{CertPEM: ca.CertPEM, KeyPEM: ca.KeyPEM()})
}

// Write writes <base>.crt and <base>.key (0600) into dir.
func (p Pair) Write(dir, base string) (certFile, keyFile string, err error) {
	return writePair(dir, base, p)
}

func writePair(dir, base string, p Pair) (string, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	c, k := filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if err := os.WriteFile(c, p.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(k, p.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return c, k, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// IdentityOfFile reads the identity of the first certificate in a PEM file.
func IdentityOfFile(certFile string) (identity.Identity, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return identity.Identity{}, err
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return identity.Identity{}, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("%s: %w", certFile, err)
	}
	return identity.FromCert(c)
}

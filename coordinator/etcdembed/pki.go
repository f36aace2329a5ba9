package etcdembed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ClientCommonName is the common name of the generated client certificate. etcd takes a client
// certificate's common name as a user name when no password is given; no etcd user has this name,
// so the certificate alone opens the connection but grants no key.
const ClientCommonName = "nodefence-etcd-client"

// Users of the locked member.
const (
	// RootUser owns the member: only the embedded etcd's own setup uses it.
	RootUser = "root"
	// User is the coordinator's user: read and write under the key prefix, nothing else.
	User = "nodefence"
)

// Files names what a client of the locked member needs; every file is mode 0600 in a 0700 directory.
type Files struct {
	// CAFile verifies the member's certificate.
	CAFile string
	// CertFile and KeyFile are the client certificate (common name ClientCommonName).
	CertFile, KeyFile string
	// Username is User; PasswordFile holds its password.
	Username, PasswordFile string
}

// pki holds the paths of the generated certificate authority and certificates in one directory.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

// ensure creates the directory, the certificate authority and the client certificate when missing,
// and (re)issues the member's certificate for hosts on every start, so a changed listen address
// is covered.
func (p pki) ensure(hosts []string) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(p.dir, 0o700); err != nil {
		return err
	}
	caCert, caKey, err := p.loadCA()
	if errors.Is(err, fs.ErrNotExist) {
		caCert, caKey, err = p.createCA()
	}
	if err != nil {
		return fmt.Errorf("etcd certificate authority in %s: %w", p.dir, err)
	}
	if _, err := os.Stat(p.path("client.crt")); errors.Is(err, fs.ErrNotExist) {
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: ClientCommonName},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if err := p.issue("client", tmpl, caCert, caKey); err != nil {
			return err
		}
	}
	tmpl := &x509.Certificate{
		Subject: pkix.Name{CommonName: "nodefence-etcd"},
		// The member's certificate serves clients and, for the peer port, both ends of a peer link.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return p.issue("server", tmpl, caCert, caKey)
}

func (p pki) loadCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(p.path("ca.key"))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("ca.crt or ca.key holds no PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func (p pki) createCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "nodefence embedded etcd CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(20, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	// The key first: a certificate without its key is a CA that can never issue again.
	if err := writePEM(p.path("ca.key"), "EC PRIVATE KEY", keyDER); err != nil {
		return nil, nil, err
	}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// issue signs tmpl with the CA and writes name.crt and name.key.
func (p pki) issue(name string, tmpl *x509.Certificate, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().AddDate(10, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("issue etcd %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(p.path(name+".key"), "EC PRIVATE KEY", keyDER); err != nil {
		return err
	}
	return writePEM(p.path(name+".crt"), "CERTIFICATE", der)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// writePEM writes one block, mode 0600, replacing the file atomically.
func writePEM(path, kind string, der []byte) error {
	return writeSecret(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}))
}

// writeSecret writes data, mode 0600, through a temporary file and a rename.
func writeSecret(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// password returns the password stored in path, creating a random one when the file is missing.
func password(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if pw := strings.TrimSpace(string(b)); pw != "" {
			return pw, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	pw := base64.RawURLEncoding.EncodeToString(raw)
	return pw, writeSecret(path, []byte(pw+"\n"))
}

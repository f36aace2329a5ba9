// Package tlsfiles loads server and client TLS configurations from PEM files. Mutual TLS is the
// default posture of every nodefence binary; plaintext needs an explicit --insecure.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// Files names the PEM files of one endpoint.
type Files struct {
	// CertFile and KeyFile are this endpoint's certificate chain and private key.
	CertFile, KeyFile string
	// CAFile verifies the peer: client certificates on a server (mutual TLS), the server on a client.
	CAFile string
	// ServerName overrides the name a client verifies in the server certificate.
	ServerName string
	// Insecure turns TLS off entirely (plaintext). It must be asked for explicitly.
	Insecure bool
}

// RegisterFlags binds the TLS flags with the given prefix ("" or e.g. "driver-").
func (f *Files) RegisterFlags(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&f.CertFile, prefix+"tls-cert", f.CertFile, "PEM certificate of "+what)
	fs.StringVar(&f.KeyFile, prefix+"tls-key", f.KeyFile, "PEM private key of "+what)
	fs.StringVar(&f.CAFile, prefix+"tls-ca", f.CAFile, "PEM CA bundle that verifies the peer of "+what)
	fs.StringVar(&f.ServerName, prefix+"tls-server-name", f.ServerName, "server name to verify (clients only)")
	fs.BoolVar(&f.Insecure, prefix+"insecure", f.Insecure, "use plaintext instead of TLS for "+what+" (tests and demos only)")
}

// Validate returns every problem with the files for a server (server=true) or a client.
func (f Files) Validate(prefix string, server bool) []error {
	if f.Insecure {
		return nil
	}
	var errs []error
	if server && f.CertFile == "" {
		errs = append(errs, fmt.Errorf("--%stls-cert: required unless --%sinsecure is set", prefix, prefix))
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		errs = append(errs, fmt.Errorf("--%stls-key: --%stls-cert and --%stls-key go together", prefix, prefix, prefix))
	}
	if !server && f.CAFile == "" {
		errs = append(errs, fmt.Errorf("--%stls-ca: required unless --%sinsecure is set", prefix, prefix))
	}
	for _, file := range []struct{ flag, path string }{
		{"tls-cert", f.CertFile}, {"tls-key", f.KeyFile}, {"tls-ca", f.CAFile},
	} {
		if file.path == "" {
			continue
		}
		if _, err := os.Stat(file.path); err != nil {
			errs = append(errs, fmt.Errorf("--%s%s: %w", prefix, file.flag, err))
		}
	}
	return errs
}

// Server returns the server TLS config, requiring and verifying client certificates when CAFile is
// set (mutual TLS), with the files as they are now (a running component uses Watch, which
// follows them). It returns nil, nil when Insecure.
func (f Files) Server() (*tls.Config, error) {
	if f.Insecure {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if f.CAFile != "" {
		pool, err := loadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client returns the client TLS config, presenting a client certificate when one is set, with the
// files as they are now (a running component dials with services/dial, which follows them).
// It returns nil, nil when Insecure.
func (f Files) Client() (*tls.Config, error) {
	if f.Insecure {
		return nil, nil
	}
	if f.CAFile == "" {
		return nil, errors.New("tls-ca: a CA bundle is required to verify the server")
	}
	pool, err := loadPool(f.CAFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: f.ServerName, MinVersion: tls.VersionTLS12}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s: no PEM certificates found", path)
	}
	return pool, nil
}

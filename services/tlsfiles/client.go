package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"
)

// ClientConfig is a client's TLS configuration with the reloader's material as it is now: the
// current CA bundle verifies the server (crypto/tls checks the whole chain and the name), and
// every handshake presents the current certificate. verify, if set, runs after that verification
// (VerifyConnection). A tls.Config's RootCAs cannot change, so a long-lived client takes a fresh
// one per connection: ClientCredentials does that for gRPC.
func (r *Reloader) ClientConfig(serverName string, verify func(tls.ConnectionState) error) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: r.Pool(), VerifyConnection: verify}
	if r.files.CertFile != "" {
		cfg.GetClientCertificate = r.GetClientCertificate
	}
	return cfg
}

// ClientCredentials are gRPC transport credentials that build every connection's TLS
// configuration from the reloader at its handshake (ClientConfig): a connection made after the
// files changed presents the new certificate and trusts the new CA bundle, with the same full
// verification of the server's chain and name as grpc's own TLS credentials, which do the
// handshake. serverName overrides the name verified ("" means the host of the address dialled).
func (r *Reloader) ClientCredentials(serverName string, verify func(tls.ConnectionState) error) credentials.TransportCredentials {
	return &clientCreds{r: r, serverName: serverName, verify: verify}
}

// IdentityCredentials are ClientCredentials for a server known by its identity, not by its
// address (another node's agent, dialled at the node's address, whose certificate names the agent
// and not the node's addresses): the server's chain is verified against the CA bundle as crypto/tls
// verifies it, for server authentication, but no host name or address is checked; verify, which
// must check the identity in the verified leaf (dial.Peer does), then decides. verify is required.
func (r *Reloader) IdentityCredentials(verify func(tls.ConnectionState) error) credentials.TransportCredentials {
	return &clientCreds{r: r, verify: verify, byIdentity: true}
}

type clientCreds struct {
	r          *Reloader
	serverName string
	verify     func(tls.ConnectionState) error
	// byIdentity: the chain is verified here and the name not at all (IdentityCredentials).
	byIdentity bool
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName // grpc's TLS credentials verify the authority's host
	}
	cfg := c.r.ClientConfig(c.serverName, c.verify)
	if c.byIdentity {
		if c.verify == nil {
			return nil, nil, errors.New("tlsfiles: a server known by its identity needs an identity check")
		}
		pool := cfg.RootCAs
		cfg.InsecureSkipVerify = true // the chain is verified below; only the name is not
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			chains, err := verifyServerChain(cs.PeerCertificates, pool)
			if err != nil {
				return err
			}
			cs.VerifiedChains = chains
			return c.verify(cs)
		}
	}
	return credentials.NewTLS(cfg).ClientHandshake(ctx, authority, conn)
}

// verifyServerChain verifies a server's certificates (leaf first) against roots for server
// authentication, at the current time, as crypto/tls does except for the name.
func verifyServerChain(certs []*x509.Certificate, roots *x509.CertPool) ([][]*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("tlsfiles: the server presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: the server's certificate: %w", err)
	}
	return chains, nil
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsfiles: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	cc := *c
	return &cc
}

// OverrideServerName is part of the interface grpc-go still has (deprecated there).
func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}

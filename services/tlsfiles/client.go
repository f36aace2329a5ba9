package tlsfiles

import (
	"context"
	"crypto/tls"
	"errors"
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

type clientCreds struct {
	r          *Reloader
	serverName string
	verify     func(tls.ConnectionState) error
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName // grpc's TLS credentials verify the authority's host
	}
	return credentials.NewTLS(c.r.ClientConfig(c.serverName, c.verify)).ClientHandshake(ctx, authority, conn)
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

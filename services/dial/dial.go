// Package dial opens gRPC client connections with nodefence's TLS posture and keepalive settings.
package dial

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wire"
)

// New returns a lazily connecting client for addr (host:port).
func New(addr string, files tlsfiles.Files, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if !files.Insecure {
		cfg, err := files.Client()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Static flow-control windows, as on the servers: no bandwidth-delay-product pings, which a
		// client would otherwise send for every burst of acknowledgements an agent stream receives.
		grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow),
	}, extra...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

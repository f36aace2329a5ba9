// Package dial opens gRPC client connections with nodefence's TLS posture and keepalive settings.
// Every outbound call of a nodefence binary checks who answers, not only that the CA signed the
// answer: Peer names the identity the server's certificate must carry (the coordinator calls only
// driver/<name> as configured; an agent and fencectl call only coordinator/*), and a server of the
// same CA presenting any other identity fails the handshake, before a request leaves.
package dial

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wire"
)

// Option configures New.
type Option func(*settings)

type settings struct {
	certs      *tlsfiles.Reloader
	peer       *expected
	byIdentity bool
	log        *slog.Logger
	onRefused  func(error)
	grpc       []grpc.DialOption
}

type expected struct {
	role identity.Role
	name string // "" accepts any name of role
}

func (e expected) String() string {
	if e.name == "" {
		return "spiffe://" + identity.TrustDomain + "/" + string(e.role) + "/*"
	}
	return identity.Identity{Role: e.role, Name: e.name}.String()
}

// Peer makes New verify, in the TLS handshake, that the server's verified certificate carries the
// identity role/name (any name of role when name is ""). A server presenting another identity, or
// none, fails the handshake: no request is sent to it. Plaintext connections (tlsfiles.Files
// Insecure, tests and demos only) carry no identity and are not checked.
func Peer(role identity.Role, name string) Option {
	return func(s *settings) { s.peer = &expected{role: role, name: name} }
}

// ByIdentity makes New verify the server by the identity Peer names and its chain alone, not by
// the address dialled: for a server whose certificate names who it is, not where it runs (another
// node's agent at that node's address). It requires Peer.
func ByIdentity() Option { return func(s *settings) { s.byIdentity = true } }

// Log makes New log every refused server at Error level, naming the address, the expected and the
// presented identity.
func Log(l *slog.Logger) Option { return func(s *settings) { s.log = l } }

// OnRefused makes New call f with the error of every server Peer refused (it names the address,
// the expected and the presented identity), so that a caller that sees only "cannot connect" in
// the connection's state can say why.
func OnRefused(f func(error)) Option { return func(s *settings) { s.onRefused = f } }

// Certs makes New take its TLS material from r (shared by a component's connections and reported
// in its metrics) instead of loading files into a reloader of its own.
func Certs(r *tlsfiles.Reloader) Option { return func(s *settings) { s.certs = r } }

// WaitOutElections makes every unary call that a coordinator refuses because no leader is elected
// yet (fault.ElectionTrailer: refused before anything was done) wait and ask again, with a backoff
// from 100 ms to 1 s, until it is answered otherwise, its context ends or max has passed since the
// first attempt. An election takes about a second; a client should not fail the operator's command
// for it. A redirect to a known leader is not retried here: the caller follows it.
func WaitOutElections(max time.Duration) Option {
	return func(s *settings) { s.grpc = append(s.grpc, grpc.WithChainUnaryInterceptor(electionWaiter(max))) }
}

func electionWaiter(max time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		giveUp := time.Now().Add(max)
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
			var md metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&md))...)
			if status.Code(err) != codes.Unavailable || !fault.ElectionFromTrailer(md) || time.Now().Add(backoff).After(giveUp) {
				return err
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// GRPC adds gRPC dial options.
func GRPC(o ...grpc.DialOption) Option { return func(s *settings) { s.grpc = append(s.grpc, o...) } }

// ErrWrongPeer is wrapped by the handshake error of a server whose identity is not the expected one.
var ErrWrongPeer = errors.New("the server's identity is not the expected one")

// New returns a lazily connecting client for addr (host:port). Each connection it makes takes the
// certificate and CA bundle as the files hold them then (tlsfiles.Reloader): a renewed
// certificate or a rolled-over CA needs no new client, the next connection uses them.
func New(addr string, files tlsfiles.Files, opts ...Option) (*grpc.ClientConn, error) {
	var s settings
	for _, o := range opts {
		o(&s)
	}
	creds := insecure.NewCredentials()
	if !files.Insecure {
		if files.CAFile == "" {
			return nil, errors.New("tls-ca: a CA bundle is required to verify the server")
		}
		certs := s.certs
		if certs == nil {
			var err error
			if certs, err = files.Watch(s.log, "dialling "+addr); err != nil {
				return nil, err
			}
		}
		var verify func(tls.ConnectionState) error
		if s.peer != nil {
			verify = verifyPeer(addr, *s.peer, s.log, s.onRefused)
		}
		switch {
		case s.byIdentity && s.peer == nil:
			return nil, errors.New("dial: a server known by its identity needs the identity (Peer)")
		case s.byIdentity:
			creds = certs.IdentityCredentials(verify)
		default:
			creds = certs.ClientCredentials(files.ServerName, verify)
		}
	}
	dopts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Static flow-control windows, as on the servers: no bandwidth-delay-product pings, which a
		// client would otherwise send for every burst of acknowledgements an agent stream receives.
		grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow),
	}, s.grpc...)
	conn, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// verifyPeer runs after crypto/tls verified the server's chain and name: it reads the identity of
// the verified leaf and refuses any other than want.
func verifyPeer(addr string, want expected, log *slog.Logger, onRefused func(error)) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		got, err := identity.FromTLS(&cs)
		presented := ""
		switch {
		case err != nil:
			presented = "no valid identity (" + err.Error() + ")"
		case got.Role != want.role || (want.name != "" && got.Name != want.name):
			presented = got.String()
		default:
			return nil
		}
		if log != nil {
			log.Error("refused a server presenting the wrong identity", "address", addr, "expected", want.String(), "presented", presented)
		}
		err = fmt.Errorf("%w: %s presented %s, expected %s", ErrWrongPeer, addr, presented, want)
		if onRefused != nil {
			onRefused(err)
		}
		return err
	}
}

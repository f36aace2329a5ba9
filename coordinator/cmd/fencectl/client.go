package main

import (
	"context"
	"errors"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// callFunc is one RPC on a connection; opts carry the trailer that may name the leader.
type callFunc func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error

func fenceClient(conn *grpc.ClientConn) coordv1.FenceServiceClient {
	return coordv1.NewFenceServiceClient(conn)
}

func clusterClient(conn *grpc.ClientConn) coordv1.ClusterServiceClient {
	return coordv1.NewClusterServiceClient(conn)
}

// connectable checks the global flags a call needs (addresses, TLS files), once, before the first
// call: the commands that call nothing never ask for them.
func (c *ctl) connectable() error {
	if c.addrList != nil {
		return nil
	}
	var problems []string
	var addrs []string
	for _, a := range strings.Split(c.addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		problems = append(problems, "--coordinator: at least one address is required")
	}
	if c.perAddr <= 0 {
		problems = append(problems, "--per-address-timeout: must be positive")
	}
	if c.timeout <= 0 {
		problems = append(problems, "--timeout: must be positive")
	}
	for _, e := range c.tls.Validate("", false) {
		problems = append(problems, e.Error())
	}
	if len(problems) > 0 {
		return usageError{strings.Join(problems, "; ")}
	}
	c.addrList = addrs
	return nil
}

// call runs fn against the coordinators in turn, following a follower's pointer to the leader.
func (c *ctl) call(ctx context.Context, fn callFunc) error { return c.try(ctx, true, fn) }

// stream is call for a server stream: the per-address deadline bounds only reaching the coordinator.
func (c *ctl) stream(ctx context.Context, fn callFunc) error { return c.try(ctx, false, fn) }

// try runs fn against the last coordinator that answered, then every address, following leader
// redirects. Each address has its own deadline (--per-address-timeout), so a coordinator that is cut
// off cannot use up the whole --timeout before a healthy one is asked.
func (c *ctl) try(ctx context.Context, bounded bool, fn callFunc) error {
	if err := c.connectable(); err != nil {
		return err
	}
	queue := append([]string(nil), c.addrList...)
	if c.addr != "" {
		queue = append([]string{c.addr}, queue...)
	}
	tried := map[string]bool{}
	var last error
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		if c.conn == nil || c.addr != addr {
			if c.conn != nil {
				c.conn.Close()
			}
			// Only a coordinator may answer (any coordinator replica): a server of the same CA
			// presenting another identity fails the handshake before a request is sent. A call
			// refused while an election runs is asked again within the address's deadline.
			refused := &refusal{}
			conn, err := dial.New(addr, c.tls, dial.Peer(identity.Coordinator, ""), dial.OnRefused(refused.set), dial.WaitOutElections(c.perAddr))
			if err != nil {
				return err
			}
			c.conn, c.addr, c.refused = conn, addr, refused
		}
		actx, cancel := context.WithTimeout(ctx, c.perAddr)
		var trailer metadata.MD
		err := ready(actx, c.conn, c.refused)
		if err == nil {
			fctx := ctx
			if bounded {
				fctx = actx
			}
			err = fn(fctx, c.conn, grpc.Trailer(&trailer))
		}
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if timedOut && (status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)) {
			err = status.Errorf(codes.Unavailable, "%s did not answer within %s", addr, c.perAddr)
		}
		if status.Code(err) != codes.Unavailable {
			return err
		}
		last = err
		if l := fault.LeaderFromTrailer(trailer); l != "" && !tried[l] {
			queue = append([]string{l}, queue...)
		}
	}
	return last
}

// refusal is the latest refusal of a connection's server by its identity (dial.OnRefused), set
// from the TLS handshake's goroutine.
type refusal struct {
	mu  sync.Mutex
	err error
}

func (r *refusal) set(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *refusal) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// ready waits until conn is connected, or ctx ends. When the server was refused for the identity
// its certificate presents, the error says so (the address, the expected and the presented
// identity): an operator pointed at the wrong server, or at an impostor, sees which.
func ready(ctx context.Context, conn *grpc.ClientConn, refused *refusal) error {
	conn.Connect()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			if err := refused.get(); err != nil {
				return status.Errorf(codes.Unavailable, "cannot connect: %v", err)
			}
			return status.Error(codes.Unavailable, "cannot connect")
		}
		if !conn.WaitForStateChange(ctx, s) {
			return status.Errorf(codes.Unavailable, "cannot connect: %v", ctx.Err())
		}
	}
}

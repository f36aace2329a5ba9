// Package peer is the agents' peer check (issue 24): in watchdog mode an agent serves PeerService
// (is there a watchdog lease here?) to the other agents over mutual TLS, and an agent without a
// lease asks a bounded number of them at once, within a bounded time, whether anyone holds one. The
// decision itself — how many "no lease" answers allow a feed — is services/wdlease's.
package peer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Answerer is what the server asks: the agent's lease (agent.Lease, or the rule's wdlease.Agent).
// It is an interface here so that the server needs no stream.
type Answerer interface {
	AnswerNoLease(now time.Time) bool
}

// Limits on what callers may spend.
const (
	// PerCallerRate and PerCallerBurst bound each calling agent: an honest one asks about once a
	// third of its watchdog timeout.
	PerCallerRate  = 2
	PerCallerBurst = 10
	// maxCallers bounds the per-caller limiters kept; past it, the table starts afresh.
	maxCallers = 20_000
)

// Server answers PeerService for this agent.
type Server struct {
	agentv1.UnimplementedPeerServiceServer
	ans Answerer
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	callers map[string]*rate.Limiter
}

// NewServer answers with ans's rule; now is the agent's clock.
func NewServer(ans Answerer, now func() time.Time, log *slog.Logger) *Server {
	return &Server{ans: ans, now: now, log: log, callers: map[string]*rate.Limiter{}}
}

// LeaseStatus answers whether this agent holds a lease. Only an agent may ask (the server's policy
// and again here), at most PerCallerRate a second; every answer is logged with the caller's
// certificate identity.
func (s *Server) LeaseStatus(ctx context.Context, _ *agentv1.LeaseStatusRequest) (*agentv1.LeaseStatusResponse, error) {
	id, ok := identity.From(ctx)
	if !ok || id.Role != identity.Agent {
		return nil, fault.ErrPermissionDenied
	}
	if !s.allow(id.String()) {
		s.log.Warn("peer check: a caller over its rate", "caller", id.String())
		return nil, fault.ErrResourceExhausted
	}
	no := s.ans.AnswerNoLease(s.now())
	s.log.Debug("peer check answered", "caller", id.String(), "no_lease", no)
	return &agentv1.LeaseStatusResponse{NoLease: no}, nil
}

func (s *Server) allow(caller string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.callers[caller]
	if l == nil {
		if len(s.callers) >= maxCallers {
			clear(s.callers)
		}
		l = rate.NewLimiter(PerCallerRate, PerCallerBurst)
		s.callers[caller] = l
	}
	return l.AllowN(s.now(), 1)
}

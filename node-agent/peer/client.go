package peer

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Bounds of one peer check.
const (
	// MaxPeers bounds the peers an agent knows.
	MaxPeers = 10_000
	// fanOut bounds the questions in flight at once.
	fanOut = 32
)

// Peer is another agent of the cluster: its node name (its certificate must say agent/<name>) and
// the address of its PeerService.
type Peer struct {
	Name, Addr string
}

// Checker asks the other agents whether anyone holds a lease.
type Checker struct {
	self  string
	peers []Peer
	files tlsfiles.Files
	log   *slog.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewChecker checks with peers (at most MaxPeers, never self) over mutual TLS with files.
func NewChecker(self string, peers []Peer, files tlsfiles.Files, log *slog.Logger) (*Checker, error) {
	if len(peers) > MaxPeers {
		return nil, fmt.Errorf("%d peers: at most %d", len(peers), MaxPeers)
	}
	ps := make([]Peer, 0, len(peers))
	for _, p := range peers {
		if err := identity.ValidName(p.Name); err != nil {
			return nil, fmt.Errorf("peer %q: %w", p.Name, err)
		}
		if p.Name != self {
			ps = append(ps, p)
		}
	}
	return &Checker{self: self, peers: ps, files: files, log: log, conns: map[string]*grpc.ClientConn{}}, nil
}

// Cluster is the cluster's size as the checker knows it: its peers and itself.
func (c *Checker) Cluster() int { return len(c.peers) + 1 }

func (c *Checker) conn(p Peer) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[p.Name]; cc != nil {
		return cc, nil
	}
	// The answer counts for p only if the peer's certificate says agent/<p.Name>. An agent's
	// certificate names the agent, not its node's addresses (deploy/README.md): it is verified by
	// that identity and the CA, whatever address --peer gives.
	cc, err := dial.New(p.Addr, c.files, dial.Peer(identity.Agent, p.Name), dial.ByIdentity())
	if err != nil {
		return nil, err
	}
	c.conns[p.Name] = cc
	return cc, nil
}

// Confirm asks the peers, at most fanOut at once and for at most within, whether they hold a
// lease, and stops once need of them said "no lease". QueriedAt is read from now before the first
// question leaves. Every peer that answered "no lease" is named by its verified certificate identity.
func (c *Checker) Confirm(ctx context.Context, now func() time.Time, within time.Duration, need int) wdlease.Confirmation {
	conf := wdlease.Confirmation{QueriedAt: now()}
	if need <= 0 || need > len(c.peers) {
		return conf
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var mu sync.Mutex
	sem := make(chan struct{}, fanOut)
	var wg sync.WaitGroup
	for _, p := range c.peers {
		select {
		case <-ctx.Done():
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if !c.ask(ctx, p) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			conf.NoLease = append(conf.NoLease, p.Name)
			if len(conf.NoLease) >= need {
				cancel()
			}
		}()
	}
	wg.Wait()
	sort.Strings(conf.NoLease)
	return conf
}

// ask reports whether p answered "no lease".
func (c *Checker) ask(ctx context.Context, p Peer) bool {
	cc, err := c.conn(p)
	if err != nil {
		c.log.Warn("peer check: cannot dial", "peer", p.Name, "error", err)
		return false
	}
	r, err := agentv1.NewPeerServiceClient(cc).LeaseStatus(ctx, &agentv1.LeaseStatusRequest{})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("peer check: no answer", "peer", p.Name, "error", err)
		}
		return false
	}
	return r.GetNoLease()
}

// Close closes the connections.
func (c *Checker) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	clear(c.conns)
}

package attack

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/node-agent/peer"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/pki"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// liar is an attacker's agent: it holds the leader's lease, yet tells every peer it holds none.
type liar struct{}

func (liar) AnswerNoLease(time.Time) bool { return true }

// TestWatchdogPeerAttacks: an agent whose node an attacker controls lies about its lease; an
// attacker with another identity's certificate answers at a peer's address; a non-agent identity
// asks an agent. None of them makes a node without a lease feed its watchdog, and none is answered.
func TestWatchdogPeerAttacks(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	serve := func(name string, ans peer.Answerer) string {
		files, err := p.Files(identity.Agent, name)
		if err != nil {
			t.Fatal(err)
		}
		s, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: files, DrainTimeout: time.Second}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		agentv1.RegisterPeerServiceServer(s.GRPC, peer.NewServer(ans, time.Now, quiet))
		go func() { _ = s.Serve() }()
		t.Cleanup(s.Stop)
		return s.Addr()
	}
	b := wdlease.Defaults(15 * time.Second)
	honest := wdlease.NewAgent(b, time.Now().Add(-time.Hour))
	if err := honest.Grant(wdlease.Grant{Epoch: 1, ID: 1, Duration: b.Lease}, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	n2, n3, impostor := serve("n2", liar{}), serve("n3", honest), serve("n9", liar{})
	files, err := p.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	self := wdlease.NewAgent(b, time.Now().Add(-time.Hour))
	for _, tc := range []struct {
		name  string
		peers []peer.Peer
	}{
		{"one liar, one honest peer holding a lease", []peer.Peer{{Name: "n2", Addr: n2}, {Name: "n3", Addr: n3}}},
		{"one liar, and an impostor (agent/n9) at n3's address", []peer.Peer{{Name: "n2", Addr: n2}, {Name: "n3", Addr: impostor}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := peer.NewChecker("n1", tc.peers, files, quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conf := c.Confirm(context.Background(), time.Now, 5*time.Second, b.PeerQuorum(c.Cluster()))
			if d := self.MayFeed(time.Now(), "n1", c.Cluster(), conf); d != wdlease.Stop {
				t.Fatalf("a node without a lease feeds (%s) on the word of %v", d, conf.NoLease)
			}
		})
	}
	for _, role := range []identity.Role{identity.Coordinator, identity.Operator, identity.Driver, identity.Viewer} {
		files, err := p.Files(role, "x")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := dial.New(n2, files, dial.Peer(identity.Agent, "n2"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = agentv1.NewPeerServiceClient(cc).LeaseStatus(ctx, &agentv1.LeaseStatusRequest{})
		cancel()
		cc.Close()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s asks an agent about its lease: %v, want PermissionDenied", role, err)
		}
	}
}

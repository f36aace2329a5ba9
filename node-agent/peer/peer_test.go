package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/pki"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testPKI(t *testing.T) *pki.PKI {
	t.Helper()
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// serve starts agent name's PeerService over mutual TLS, answering with ans.
func serve(t *testing.T, p *pki.PKI, name string, ans Answerer) string {
	t.Helper()
	files, err := p.Files(identity.Agent, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: files, DrainTimeout: time.Second}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	agentv1.RegisterPeerServiceServer(s.GRPC, NewServer(ans, time.Now, quiet))
	go func() { _ = s.Serve() }()
	t.Cleanup(s.Stop)
	return s.Addr()
}

// lease is the real rule's agent side, started long ago (past its restart guard); held gives it a
// lease from now on.
func lease(held bool) *wdlease.Agent {
	b := wdlease.Defaults(15 * time.Second)
	a := wdlease.NewAgent(b, time.Now().Add(-time.Hour))
	if held {
		now := time.Now()
		if err := a.Grant(wdlease.Grant{Epoch: 1, ID: 1, Duration: b.Lease}, now, now); err != nil {
			panic(err)
		}
		// A lease of 4 s: long enough for the test's questions.
	}
	return a
}

// An agent without a lease asks its peers over mutual TLS: a quorum of "no lease" from the right
// identities lets it feed; one peer holding a lease, or an address answering with another agent's
// certificate, does not count.
func TestConfirmOverMutualTLS(t *testing.T) {
	p := testPKI(t)
	n2, n3 := serve(t, p, "n2", lease(false)), serve(t, p, "n3", lease(false))
	held := serve(t, p, "n4", lease(true))
	files, err := p.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	self := lease(false)
	b := wdlease.Defaults(15 * time.Second)
	for _, tc := range []struct {
		name  string
		peers []Peer
		want  []string
		feed  wdlease.Decision
	}{
		{"both others of three say no lease", []Peer{{"n2", n2}, {"n3", n3}}, []string{"n2", "n3"}, wdlease.FeedPeers},
		{"one of them holds a lease", []Peer{{"n2", n2}, {"n4", held}}, []string{"n2"}, wdlease.Stop},
		{"an address answering with another agent's certificate", []Peer{{"n2", n2}, {"n3", n2}}, []string{"n2"}, wdlease.Stop},
		{"itself in the list is skipped", []Peer{{"n1", n2}, {"n2", n2}, {"n3", n3}}, []string{"n2", "n3"}, wdlease.FeedPeers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewChecker("n1", tc.peers, files, quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conf := c.Confirm(context.Background(), time.Now, 5*time.Second, b.PeerQuorum(c.Cluster()))
			if fmt.Sprint(conf.NoLease) != fmt.Sprint(tc.want) {
				t.Fatalf("no lease from %v, want %v", conf.NoLease, tc.want)
			}
			if d := self.MayFeed(time.Now(), "n1", c.Cluster(), conf); d != tc.feed {
				t.Fatalf("decision %s, want %s", d, tc.feed)
			}
		})
	}
}

// Only agents may ask, each at a bounded rate; the answer names no one.
func TestServerRefusals(t *testing.T) {
	p := testPKI(t)
	addr := serve(t, p, "n2", lease(false))
	ask := func(role identity.Role, name string) error {
		files, err := p.Files(role, name)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := dial.New(addr, files, dial.Peer(identity.Agent, "n2"))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = agentv1.NewPeerServiceClient(cc).LeaseStatus(ctx, &agentv1.LeaseStatusRequest{})
		return err
	}
	if err := ask(identity.Operator, "alice"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an operator's question: %v, want PermissionDenied", err)
	}
	var last error
	for range PerCallerBurst + 5 {
		if last = ask(identity.Agent, "n3"); last != nil {
			break
		}
	}
	if status.Code(last) != codes.ResourceExhausted {
		t.Errorf("%d questions at once from one agent: %v, want ResourceExhausted", PerCallerBurst+5, last)
	}
	if err := ask(identity.Agent, "n5"); err != nil {
		t.Errorf("another agent is limited by the first one's rate: %v", err)
	}
}

// A check of many peers that do not answer ends within its bound, asking at most fanOut at once.
func TestConfirmBounded(t *testing.T) {
	p := testPKI(t)
	files, err := p.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	var peers []Peer
	for i := range 500 {
		peers = append(peers, Peer{Name: fmt.Sprintf("p%d", i), Addr: "127.0.0.1:1"}) // nothing listens on port 1
	}
	c, err := NewChecker("n1", peers, files, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	conf := c.Confirm(context.Background(), time.Now, time.Second, wdlease.Defaults(time.Second).PeerQuorum(c.Cluster()))
	if took := time.Since(start); took > 3*time.Second || len(conf.NoLease) != 0 {
		t.Fatalf("took %s, %d answers", took, len(conf.NoLease))
	}
	if _, err := NewChecker("n1", make([]Peer, MaxPeers+1), files, quiet); err == nil {
		t.Error("more than MaxPeers peers accepted")
	}
	if _, err := NewChecker("n1", []Peer{{Name: "Bad_Name", Addr: "x:1"}}, files, quiet); err == nil || errors.Is(err, context.Canceled) {
		t.Error("an invalid peer name accepted")
	}
}

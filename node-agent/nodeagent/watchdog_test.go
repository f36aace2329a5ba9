package nodeagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/peer"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// An agent without a lease — a fresh start, or a restart while the control plane is away — never
// opens the device: opening arms and feeds it, which would keep a partitioned node alive past the
// leader's safe time (and a crash loop would keep it alive for ever).
func TestNoLeaseNeverOpensTheDevice(t *testing.T) {
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	opts := Config{watchdogDevice: sim.Path, watchdogTimeout: 3 * time.Second}
	opts.agent.NodeName = "n1"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, ok := prepareWatchdog(&opts, log)
	if !ok || opts.agent.Lease == nil {
		t.Fatal("prepareWatchdog refused a writable device, or set no lease")
	}
	// After the control plane was away, the agent must be back at the leader within the timeout.
	if got := opts.agent.MaxBackoff; got != 750*time.Millisecond {
		t.Errorf("reconnect backoff capped at %s in watchdog mode with a 3s timeout, want 750ms", got)
	}
	// The feeder reports to its agent only once it armed the device: without a lease it needs none.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := f.run(nil)(ctx); err != nil {
		t.Fatal(err)
	}
	if f.device() != nil || sim.Feeds() != 0 || sim.State() != watchdogsim.Disarmed {
		t.Fatalf("without a lease: device opened %v, %d feeds, state %v", f.device() != nil, sim.Feeds(), sim.State())
	}
	for _, path := range []string{filepath.Join(t.TempDir(), "missing"), t.TempDir()} {
		opts := Config{watchdogDevice: path, watchdogTimeout: 3 * time.Second}
		if _, ok := prepareWatchdog(&opts, log); ok {
			t.Errorf("%s: prepared as a watchdog device", path)
		}
	}
}

// failingSampler is the agent's signal reader in tests that never run the agent's stream: it fails.
type failingSampler struct{}

func (failingSampler) Sample(context.Context) (*agentv1.SignalSample, error) {
	return nil, errors.New("no signals in this test")
}

// servePeer starts agent name's peer check over mutual TLS, answering with the rule's agent side
// ans.
func servePeer(t *testing.T, p *pki.PKI, name string, ans peer.Answerer) string {
	t.Helper()
	files, err := p.Files(identity.Agent, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: files, DrainTimeout: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	agentv1.RegisterPeerServiceServer(s.GRPC, peer.NewServer(ans, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil))))
	go func() { _ = s.Serve() }()
	t.Cleanup(s.Stop)
	return s.Addr()
}

// With the control plane away for everyone, an agent without a lease arms and feeds its watchdog on
// the word of a quorum of its peers (both others of three), asked over mutual TLS, and names them by
// their certificates; when one of them holds a lease, it does not.
func TestFeedsOnPeersWord(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := wdlease.Defaults(15 * time.Second)
	away := func() *wdlease.Agent { return wdlease.NewAgent(b, time.Now().Add(-time.Hour)) }
	holding := away()
	if err := holding.Grant(wdlease.Grant{Epoch: 1, ID: 1, Duration: b.Lease}, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	n2, n3, n4 := servePeer(t, p, "n2", away()), servePeer(t, p, "n3", away()), servePeer(t, p, "n4", holding)
	for _, tc := range []struct {
		name  string
		peers []peer.Peer
		feeds bool
	}{
		{"nobody holds a lease", []peer.Peer{{Name: "n2", Addr: n2}, {Name: "n3", Addr: n3}}, true},
		{"n4 holds one", []peer.Peer{{Name: "n2", Addr: n2}, {Name: "n4", Addr: n4}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Stop()
			files, err := p.Files(identity.Agent, "n1")
			if err != nil {
				t.Fatal(err)
			}
			var logs syncbuf.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			opts := Config{watchdogDevice: sim.Path, watchdogTimeout: 3 * time.Second, peers: tc.peers}
			opts.agent.NodeName, opts.agent.TLS = "n1", files
			f, ok := prepareWatchdog(&opts, log)
			if !ok {
				t.Fatal("prepareWatchdog refused")
			}
			if _, ok := startPeers(f, &opts, log); !ok || f.peers == nil {
				t.Fatal("no peer checker")
			}
			defer f.peers.Close()
			f.lease = agent.NewLease(b, time.Now().Add(-time.Hour), log) // this agent, too, started long ago
			a, err := agent.New(agent.Config{Coordinators: []string{"127.0.0.1:1"}, NodeName: "n1", BootID: "b1", TLS: files, Lease: f.lease}, failingSampler{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
			defer cancel()
			if err := f.run(a)(ctx); err != nil {
				t.Fatal(err)
			}
			defer f.stop(true, log)
			fed := f.device() != nil && sim.Feeds() > 0
			if fed != tc.feeds {
				t.Fatalf("fed %v (%d feeds), want %v\n%s", fed, sim.Feeds(), tc.feeds, logs.String())
			}
			if said := strings.Contains(logs.String(), `peers="[agent/n2 agent/n3]"`); said != tc.feeds {
				t.Fatalf("the agents vouching are named %v, want %v\n%s", said, tc.feeds, logs.String())
			}
		})
	}
}

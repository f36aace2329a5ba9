package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// An operator's pause goes from the API through the store to the next term's engine: a leader
// that resigns and is elected again restores the pause, and a resume clears it.
func TestPauseSurvivesANewTerm(t *testing.T) {
	insecure := tlsfiles.Files{Insecure: true}
	fences := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(fences, []byte(`drivers:
  ipmi: {endpoint: "127.0.0.1:1"}
templates:
  bmc: {driver: ipmi, parameters: {username: admin}}
nodes:
  node-1:
    zone: a
    methods:
      bmc: {template: bmc, parameters: {ip: 127.0.0.1, password: secret}}
    steps:
      power_management: [bmc]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{
		Server:    server.Config{Listen: "127.0.0.1:0", TLS: insecure, UnauthenticatedCaller: "any", DrainTimeout: time.Second},
		DriverTLS: insecure, FenceConfig: fences, DataDir: t.TempDir(),
		EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); err := a.Run(ctx); t.Log("run:", err) }()
	defer func() { cancel(); <-done }()
	cc, err := dial.New(a.Addr(), insecure)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cluster := coordv1.NewClusterServiceClient(cc)
	// paused waits for a leader whose epoch is above after and reports its engine's pause.
	paused := func(after int64) (bool, int64) {
		t.Helper()
		for {
			gl, err := cluster.GetLeader(ctx, &coordv1.GetLeaderRequest{})
			if err == nil && gl.IsSelf && gl.Epoch > after {
				if z, err := cluster.ListZones(ctx, &coordv1.ListZonesRequest{}); err == nil {
					return z.EvictionsPaused, gl.Epoch
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no leader above epoch %d: %v", after, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	p, epoch := paused(0)
	if p {
		t.Fatal("paused before anyone paused")
	}
	if _, err := cluster.PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := paused(epoch - 1); !p {
		t.Fatal("not paused after PauseEvictions")
	}
	resign(ctx, t, a)
	if p, epoch = paused(epoch); !p {
		t.Fatalf("the term at epoch %d did not restore the pause", epoch)
	}
	if _, err := cluster.ResumeEvictions(ctx, &coordv1.ResumeEvictionsRequest{}); err != nil {
		t.Fatal(err)
	}
	resign(ctx, t, a)
	if p, epoch = paused(epoch); p {
		t.Fatalf("the term at epoch %d is paused after ResumeEvictions", epoch)
	}
}

// resign ends the current term as a leader that steps down does.
func resign(ctx context.Context, t *testing.T, a *App) {
	t.Helper()
	term := a.Term()
	if term == nil {
		t.Fatal("not leading")
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

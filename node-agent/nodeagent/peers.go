package nodeagent

import (
	"context"
	"log/slog"
	"time"

	"github.com/nodefence/nodefence/node-agent/peer"
	"github.com/nodefence/nodefence/services/server"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// watchdogMode prepares the watchdog (prepareWatchdog) and its peer check (startPeers).
func watchdogMode(opts *Config, log *slog.Logger) (*feeder, []task, bool) {
	f, ok := prepareWatchdog(opts, log)
	if !ok {
		return nil, nil, false
	}
	tasks, ok := startPeers(f, opts, log)
	return f, tasks, ok
}

// startPeers sets up the peer check of a watchdog-mode agent: the server answering other agents on
// --peer-listen (a task), and the checker its feeder asks while it holds no lease (--peer).
func startPeers(f *feeder, opts *Config, log *slog.Logger) ([]task, bool) {
	if f == nil {
		return nil, true
	}
	if len(opts.peers) > 0 {
		c, err := peer.NewChecker(opts.agent.NodeName, opts.peers, opts.agent.TLS, log)
		if err != nil {
			log.Error("invalid peers", "error", err)
			return nil, false
		}
		f.peers = c
	}
	if opts.peerListen == "" {
		return nil, true
	}
	s, err := server.New(server.Config{Listen: opts.peerListen, TLS: opts.agent.TLS}, log)
	if err != nil {
		log.Error("cannot serve the peer check", "address", opts.peerListen, "error", err)
		return nil, false
	}
	agentv1.RegisterPeerServiceServer(s.GRPC, peer.NewServer(f.lease, time.Now, log))
	log.Info("answering other agents' lease checks", "address", s.Addr(), "peers", len(opts.peers))
	return []task{{"peer-check", func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- s.Serve() }()
		select {
		case <-ctx.Done():
			s.Stop()
			<-errc
			return nil
		case err := <-errc:
			return err
		}
	}}}, true
}

// Package etcdembed runs a single-member etcd inside the coordinator process, so one binary is a
// complete system on a laptop or a small site. Production sites point --etcd-endpoints at a real
// etcd cluster instead.
package etcdembed

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Config is the embedded etcd's configuration.
type Config struct {
	// Name is the member name.
	Name string
	// DataDir holds the member's data; it persists across restarts.
	DataDir string
	// ClientListen and PeerListen are host:port on 127.0.0.1 or another local address; port 0 picks
	// a free port.
	ClientListen, PeerListen string
	// UnsafeNoFsync trades durability for speed (tests and demos only).
	UnsafeNoFsync bool
	// Log receives etcd's warnings and errors; nil discards them.
	Log *slog.Logger
}

// Etcd is a running embedded member.
type Etcd struct {
	e *embed.Etcd
	// Endpoint is the client URL to give to clientv3.
	Endpoint string
}

// Start starts the member and waits until it serves, for at most 60 s.
func Start(cfg Config) (*Etcd, error) {
	clientURL, err := pickURL(cfg.ClientListen)
	if err != nil {
		return nil, fmt.Errorf("etcd client listen: %w", err)
	}
	peerURL, err := pickURL(cfg.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("etcd peer listen: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	if ec.Name == "" {
		ec.Name = "nodefence"
	}
	ec.Dir = cfg.DataDir
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapToSlog(log))
	ec.AutoCompactionMode = "revision"
	ec.AutoCompactionRetention = "10000"
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.DataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s not ready after 60s", cfg.DataDir)
	}
	return &Etcd{e: e, Endpoint: clientURL.String()}, nil
}

// Close stops the member.
func (e *Etcd) Close() { e.e.Close() }

// pickURL turns host:port into an http URL, replacing port 0 with a free port.
func pickURL(hostport string) (*url.URL, error) {
	if hostport == "" {
		hostport = "127.0.0.1:0"
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	if port == "0" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		hostport = l.Addr().String()
		l.Close()
	}
	return &url.URL{Scheme: "http", Host: hostport}, nil
}

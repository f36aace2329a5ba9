// Package etcdembed runs a single-member etcd inside the coordinator process, so one binary is a
// complete system on a laptop or a small site. Production sites point --etcd-endpoints at a real
// etcd cluster instead.
//
// The member is locked: its client and peer ports speak TLS and require a client certificate from
// a certificate authority generated in SecretsDir, and etcd authentication is on, with a root user
// and a nodefence user whose role may read and write only under the key prefix. A local process
// needs both the client certificate and the nodefence password (files readable by the
// coordinator's user only) to read or write a record.
package etcdembed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
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
	// SecretsDir holds the generated certificate authority, certificates and passwords (mode 0700,
	// files 0600); required unless Open. Keep it outside DataDir: etcd owns that directory.
	SecretsDir string
	// Prefix is the key prefix the nodefence user may read and write (for example "/nodefence");
	// required unless Open.
	Prefix string
	// QuotaBackendBytes is the database size at which etcd raises its NOSPACE alarm and refuses
	// writes; 0 is etcd's default (2 GiB).
	QuotaBackendBytes int64
	// Open serves plain HTTP without authentication. Only for tests of packages that need an etcd
	// and are not about its protection; the coordinator never sets it.
	Open bool
}

// Etcd is a running embedded member.
type Etcd struct {
	e *embed.Etcd
	// Endpoint is the client URL to give to clientv3.
	Endpoint string
	// Client is what a client needs to use the member (zero when Open).
	Client Files
}

// Start starts the member, locks it unless Open, and waits until it serves, for at most 60 s.
func Start(cfg Config) (*Etcd, error) {
	scheme := "https"
	if cfg.Open {
		scheme = "http"
	} else if cfg.SecretsDir == "" || cfg.Prefix == "" {
		return nil, errors.New("embedded etcd: SecretsDir and Prefix are required unless Open")
	}
	clientURL, err := pickURL(cfg.ClientListen, scheme)
	if err != nil {
		return nil, fmt.Errorf("etcd client listen: %w", err)
	}
	peerURL, err := pickURL(cfg.PeerListen, scheme)
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
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	p := pki{dir: cfg.SecretsDir}
	if !cfg.Open {
		if err := p.ensure([]string{clientURL.Hostname(), peerURL.Hostname()}); err != nil {
			return nil, err
		}
		cert, key, ca := p.path("server.crt"), p.path("server.key"), p.path("ca.crt")
		ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile, ec.ClientTLSInfo.TrustedCAFile = cert, key, ca
		ec.ClientTLSInfo.ClientCertAuth = true
		ec.PeerTLSInfo.CertFile, ec.PeerTLSInfo.KeyFile, ec.PeerTLSInfo.TrustedCAFile = cert, key, ca
		ec.PeerTLSInfo.ClientCertAuth = true
	}
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
	out := &Etcd{e: e, Endpoint: clientURL.String()}
	if cfg.Open {
		return out, nil
	}
	out.Client = Files{
		CAFile: p.path("ca.crt"), CertFile: p.path("client.crt"), KeyFile: p.path("client.key"),
		Username: User, PasswordFile: p.path(User + ".password"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := lock(ctx, out.Endpoint, p, cfg.Prefix); err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded etcd: enable authentication: %w", err)
	}
	return out, nil
}

// Close stops the member.
func (e *Etcd) Close() { e.e.Close() }

// TLS returns the client TLS configuration the files describe.
func (f Files) TLS() (*tls.Config, error) {
	caPEM, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no PEM certificate", f.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// lock makes sure etcd authentication is on with a root user and the nodefence user, whose role
// may read and write only under prefix. It is idempotent: a first start creates the users, later
// starts (and a start after a crash half-way) complete and re-grant what is missing.
func lock(ctx context.Context, endpoint string, p pki, prefix string) error {
	rootPW, err := password(p.path(RootUser + ".password"))
	if err != nil {
		return err
	}
	userPW, err := password(p.path(User + ".password"))
	if err != nil {
		return err
	}
	tc, err := Files{CAFile: p.path("ca.crt"), CertFile: p.path("client.crt"), KeyFile: p.path("client.key")}.TLS()
	if err != nil {
		return err
	}
	cc := clientv3.Config{Endpoints: []string{endpoint}, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop(), Context: ctx}
	cli, err := clientv3.New(cc)
	if err != nil {
		return err
	}
	st, err := cli.AuthStatus(ctx)
	cli.Close()
	enabled := err == nil && st.Enabled
	switch {
	case errors.Is(err, rpctypes.ErrUserNotFound), errors.Is(err, rpctypes.ErrPermissionDenied):
		// Authentication is on: the certificate's common name is no user.
		enabled = true
	case err != nil:
		return fmt.Errorf("auth status: %w", err)
	}
	if enabled {
		cc.Username, cc.Password = RootUser, rootPW
	}
	if cli, err = clientv3.New(cc); err != nil {
		return fmt.Errorf("connect as %s: %w", RootUser, err)
	}
	defer cli.Close()
	exists := func(err error) error {
		if errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return nil
		}
		return err
	}
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, RootUser); return exists(err) },
		func() error { _, err := cli.RoleAdd(ctx, User); return exists(err) },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, User, prefix+"/", clientv3.GetPrefixRangeEnd(prefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
	}
	if !enabled {
		// Before authentication is on, (re)set both passwords to the stored ones.
		for _, u := range []struct{ name, pw string }{{RootUser, rootPW}, {User, userPW}} {
			steps = append(steps, func() error {
				_, err := cli.UserAdd(ctx, u.name, u.pw)
				if errors.Is(err, rpctypes.ErrUserAlreadyExist) {
					_, err = cli.UserChangePassword(ctx, u.name, u.pw)
				}
				return err
			})
		}
		steps = append(steps,
			func() error { _, err := cli.UserGrantRole(ctx, RootUser, RootUser); return err },
			func() error { _, err := cli.UserGrantRole(ctx, User, User); return err },
			func() error { _, err := cli.AuthEnable(ctx); return err },
		)
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// pickURL turns host:port into a URL, replacing port 0 with a free port.
func pickURL(hostport, scheme string) (*url.URL, error) {
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
	return &url.URL{Scheme: scheme, Host: hostport}, nil
}

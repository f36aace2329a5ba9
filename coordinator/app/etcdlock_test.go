package app

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/syncbuf"
)

// lockedEtcd is how a test etcd admits clients.
type lockedEtcd struct {
	plaintext bool
	// trusted is the CA file etcd verifies clients with; clientCertAuth requires a certificate.
	trusted        string
	clientCertAuth bool
	// cert and key are the member's server certificate.
	cert, key string
}

// startLockedEtcd runs a real etcd member on 127.0.0.1 as e says and returns its client URL.
func startLockedEtcd(t *testing.T, e lockedEtcd) string {
	t.Helper()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	scheme := "https"
	if e.plaintext {
		scheme = "http"
	}
	client, peer := url.URL{Scheme: scheme, Host: free()}, url.URL{Scheme: "http", Host: free()}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir, cfg.UnsafeNoFsync = "lock", t.TempDir(), true
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if !e.plaintext {
		cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = e.cert, e.key
		cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = e.trusted, e.clientCertAuth
	}
	m, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	select {
	case <-m.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	return client.String()
}

// lockPKI is the nodefence CA with a coordinator's certificate, and etcd's own CA with a member's
// and the coordinators' etcd client certificate.
type lockPKI struct {
	dir                                 string
	nodefenceCA, coordinator            tlsfiles.Files
	etcdCA, etcdMember, etcdCoordinator tlsfiles.Files
	nodefenceEtcdClient                 tlsfiles.Files
}

func newLockPKI(t *testing.T) lockPKI {
	t.Helper()
	p := lockPKI{dir: t.TempDir()}
	issue := func(ca *certs.CA, caFile, base, cn string, id *identity.Identity) tlsfiles.Files {
		var pair certs.Pair
		var err error
		if id != nil {
			pair, err = ca.Issue(*id, []string{"127.0.0.1"}, time.Hour)
		} else {
			pair, err = ca.IssueURIs(cn, nil, []string{"127.0.0.1"}, time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		c, k, err := pair.Write(p.dir, base)
		if err != nil {
			t.Fatal(err)
		}
		return tlsfiles.Files{CertFile: c, KeyFile: k, CAFile: caFile}
	}
	ca, err := certs.NewCA("nodefence CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile, _, err := ca.WriteCA(p.dir)
	if err != nil {
		t.Fatal(err)
	}
	p.nodefenceCA = tlsfiles.Files{CAFile: caFile}
	p.coordinator = issue(ca, caFile, "coordinator", "", &identity.Identity{Role: identity.Coordinator, Name: "c1"})
	p.nodefenceEtcdClient = issue(ca, caFile, "nodefence-etcd-client", "nodefence-coordinator", nil)
	eca, err := certs.NewCA("nodefence etcd CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ecaFile, _, err := certs.Pair{CertPEM: eca.CertPEM, KeyPEM: eca.KeyPEM()}.Write(p.dir, "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	p.etcdCA = tlsfiles.Files{CAFile: ecaFile}
	p.etcdMember = issue(eca, ecaFile, "etcd-member", "nodefence-etcd", nil)
	p.etcdCoordinator = issue(eca, ecaFile, "etcd-coordinator", "nodefence-coordinator", nil)
	return p
}

// runOn starts a coordinator (its gRPC server on mutual TLS with the nodefence certificate) on the
// etcd at endpoint with access, and returns its log and Run's error (nil when it was still running
// after the check).
func runOn(t *testing.T, p lockPKI, endpoint string, access EtcdAccess) (string, error) {
	t.Helper()
	fences := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(fences, []byte("drivers:\n  ipmi: {endpoint: \"127.0.0.1:1\"}\ntemplates:\n  bmc: {driver: ipmi, parameters: {username: admin}}\n"+
		"nodes:\n  node-1:\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, password: secret}}\n    steps:\n      power_management: [bmc]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(Config{
		Server:    server.Config{Listen: "127.0.0.1:0", TLS: p.coordinator, DrainTimeout: time.Second},
		DriverTLS: tlsfiles.Files{Insecure: true}, FenceConfig: fences, EtcdEndpoints: []string{endpoint}, EtcdAccess: access,
		ElectionTTL: 3 * time.Second,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-done:
			done <- nil
			return logs.String(), err
		case <-deadline:
			t.Fatalf("the etcd check neither refused nor passed in 30 s:\n%s", logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if strings.Contains(logs.String(), "etcd admits only") || strings.Contains(logs.String(), "etcd is not locked") {
			return logs.String(), nil
		}
	}
}

// The coordinator refuses to run on an etcd that admits a client other than the coordinators —
// without a certificate, in plaintext, or with a certificate of the nodefence CA, which signs every
// agent's — and runs on one that trusts a CA of its own (deploy/'s scheme). A user name does not
// hide etcd's authentication being off.
func TestEtcdLockRefusesOpenEtcd(t *testing.T) {
	p := newLockPKI(t)
	withCA := func(f tlsfiles.Files) EtcdAccess {
		return EtcdAccess{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}
	}
	nodefenceTrusted := lockedEtcd{trusted: p.nodefenceCA.CAFile, clientCertAuth: true, cert: p.etcdMember.CertFile, key: p.etcdMember.KeyFile}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("unused\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		etcd   lockedEtcd
		access EtcdAccess
		want   []string // nil: runs
	}{
		{"etcd's own CA (deploy/)", lockedEtcd{trusted: p.etcdCA.CAFile, clientCertAuth: true, cert: p.etcdMember.CertFile, key: p.etcdMember.KeyFile},
			withCA(p.etcdCoordinator), nil},
		{"the nodefence CA, the coordinator's own certificate as etcd client", nodefenceTrusted,
			EtcdAccess{CAFile: p.etcdCA.CAFile, CertFile: p.coordinator.CertFile, KeyFile: p.coordinator.KeyFile},
			[]string{"refusing to run", "is signed by the nodefence CA", "etcd's authentication is off"}},
		{"the nodefence CA, a separate etcd client certificate of it, and a user etcd ignores", nodefenceTrusted,
			EtcdAccess{CAFile: p.etcdCA.CAFile, CertFile: p.nodefenceEtcdClient.CertFile, KeyFile: p.nodefenceEtcdClient.KeyFile, Username: "nodefence", PasswordFile: pw},
			[]string{"is signed by the nodefence CA", "answered a read of /nodefence/ by this coordinator's nodefence certificate", "--etcd-username is ignored"}},
		{"TLS without client certificates", lockedEtcd{cert: p.etcdMember.CertFile, key: p.etcdMember.KeyFile},
			withCA(p.etcdCA), []string{"answered a read of /nodefence/ by a TLS client without a certificate"}},
		{"plaintext", lockedEtcd{plaintext: true}, EtcdAccess{}, []string{"answered a read of /nodefence/ by a plaintext client without a user"}},
		{"plaintext, --etcd-allow-open", lockedEtcd{plaintext: true}, EtcdAccess{AllowOpen: true}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := startLockedEtcd(t, c.etcd)
			logs, err := runOn(t, p, ep, c.access)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Run refused: %v\n%s", err, logs)
				}
				if c.access.AllowOpen && !strings.Contains(logs, "etcd is not locked (--etcd-allow-open") {
					t.Errorf("--etcd-allow-open ran without the warning:\n%s", logs)
				}
				return
			}
			if err == nil {
				t.Fatalf("Run ran on an etcd that admits other clients:\n%s", logs)
			}
			all := err.Error() + "\n" + logs
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("error and log miss %q:\n%v\n%s", w, err, logs)
				}
			}
		})
	}
}

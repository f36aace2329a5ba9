package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// probeTimeout bounds one probe of etcd's lock (a client that etcd must refuse).
const probeTimeout = 3 * time.Second

// etcdLockCheck is what the start-up check of etcd's lock needs: etcd's endpoints, the access the
// coordinator was given, and its own nodefence certificate (the CA of which signs every agent's).
type etcdLockCheck struct {
	endpoints []string
	access    EtcdAccess
	// nodefenceCert, nodefenceKey and nodefenceCA are --tls-cert, --tls-key and --tls-ca ("" when
	// the server runs without TLS).
	nodefenceCert, nodefenceKey, nodefenceCA string
	prefix                                   string
}

// checkEtcdLocked waits until etcd answers this coordinator, then refuses (an error naming the
// problem) an etcd that admits a client it should not: one without a certificate or in plaintext,
// or one with a certificate of the nodefence CA, which signs every agent's certificate. With
// --etcd-allow-open the problems are logged instead. It also says when --etcd-username is ignored.
func (a *App) checkEtcdLocked(ctx context.Context) error {
	var enabled bool
	for {
		var err error
		if enabled, err = a.etcdAnswers(ctx); err == nil {
			break
		}
		a.log.Warn("waiting for etcd before checking that it admits only coordinators", "err", err)
		select {
		case <-a.clock().After(campaignRetry):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if a.lock.access.Username != "" && !enabled {
		a.log.Warn("--etcd-username is ignored: etcd's authentication is off, so etcd takes neither the user nor its password; its client certificates alone decide who gets in")
	}
	problems := a.lock.probe(ctx, enabled)
	if len(problems) == 0 {
		a.log.Info("etcd admits only this coordinator's etcd credentials: a client without them was refused", "auth_enabled", enabled)
		return nil
	}
	if a.cfg.EtcdAccess.AllowOpen {
		for _, p := range problems {
			a.log.Warn("etcd is not locked (--etcd-allow-open: running anyway)", "problem", p)
		}
		return nil
	}
	return fmt.Errorf("refusing to run on an etcd that admits other clients than the coordinators (any of them can forge fence records, pause evictions or delete the election key; see deploy/README.md, section etcd): %w", errors.Join(problems...))
}

// etcdAnswers reads under the prefix as this coordinator and asks whether etcd's authentication is
// on.
func (a *App) etcdAnswers(ctx context.Context) (authEnabled bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := a.cli.Get(cctx, a.lock.prefix+"/", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly(), clientv3.WithSerializable()); err != nil {
		return false, err
	}
	st, err := a.cli.AuthStatus(cctx)
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		// With authentication on, etcd answers AuthStatus to its root user only: a prefix-scoped
		// user (the embedded etcd's coordinator) is told "permission denied", which only an etcd
		// with authentication on says.
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("auth status: %w", err)
	}
	return st.Enabled, nil
}

// probe tries, on every endpoint, the clients etcd must refuse, and returns a problem for each one
// it admitted. A probe that fails for any reason counts as refused: only an answer proves
// admission.
func (c etcdLockCheck) probe(ctx context.Context, authEnabled bool) []error {
	var problems []error
	foreign, err := c.foreignCert()
	if err != nil {
		problems = append(problems, err)
	}
	if !authEnabled && c.signedByNodefenceCA() {
		problems = append(problems, fmt.Errorf("--etcd-tls-cert %s is signed by the nodefence CA (--tls-ca %s), which signs every agent's certificate, and etcd's authentication is off: etcd admits any agent; give etcd a CA of its own (fencectl certs --etcd)", c.access.CertFile, c.nodefenceCA))
	}
	for _, ep := range c.endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			// A scheme-less host:port is plaintext to clientv3.
			u = &url.URL{Scheme: "http", Host: ep}
		}
		var tries []probeTry
		switch u.Scheme {
		case "https":
			// The server's certificate is not checked: the probe sends nothing secret, and only
			// whether etcd answers matters.
			tries = append(tries, probeTry{"a TLS client without a certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}},
				probeTry{"a plaintext client", nil})
			if foreign != nil {
				tries = append(tries, probeTry{"this coordinator's nodefence certificate (--tls-cert " + c.nodefenceCert + "), from the CA that signs every agent's certificate",
					&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*foreign}}})
			}
		case "http":
			tries = append(tries, probeTry{"a plaintext client without a user", nil})
		default:
			continue // unix sockets: only local processes reach them
		}
		for _, t := range tries {
			if err := probeRead(ctx, u.Host, t.tc, c.prefix); err == nil {
				problems = append(problems, fmt.Errorf("etcd %s answered a read of %s/ by %s", ep, c.prefix, t.what))
			}
		}
	}
	return problems
}

// probeTry is one client etcd must refuse: what it is, and its TLS (nil: plaintext).
type probeTry struct {
	what string
	tc   *tls.Config
}

// foreignCert is the coordinator's nodefence certificate when it differs from its etcd client
// certificate (nil when there is none, or they are the same: signedByNodefenceCA covers that).
func (c etcdLockCheck) foreignCert() (*tls.Certificate, error) {
	if c.nodefenceCert == "" || c.nodefenceKey == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.nodefenceCert, c.nodefenceKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	if c.access.CertFile != "" {
		if own, err := tls.LoadX509KeyPair(c.access.CertFile, c.access.KeyFile); err == nil && bytes.Equal(own.Certificate[0], cert.Certificate[0]) {
			return nil, nil
		}
	}
	return &cert, nil
}

// signedByNodefenceCA reports whether the etcd client certificate chains to the nodefence CA: etcd
// accepted it, so etcd trusts that CA.
func (c etcdLockCheck) signedByNodefenceCA() bool {
	if c.access.CertFile == "" || c.nodefenceCA == "" {
		return false
	}
	caPEM, err := os.ReadFile(c.nodefenceCA)
	if err != nil {
		return false
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return false
	}
	own, err := tls.LoadX509KeyPair(c.access.CertFile, c.access.KeyFile)
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(own.Certificate[0])
	if err != nil {
		return false
	}
	inter := x509.NewCertPool()
	for _, der := range own.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

// probeRead reads one key under prefix from etcd at hostport as a bare client: tc's certificate
// (or plaintext when nil), no user, no retries. nil means etcd answered.
func probeRead(ctx context.Context, hostport string, tc *tls.Config, prefix string) error {
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient("passthrough:///"+hostport, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	key := prefix + "/"
	_, err = pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(key)),
		Limit: 1, KeysOnly: true, Serializable: true})
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", strings.TrimSpace(hostport), err)
}

package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
)

// The coordinator's etcd client follows its files: its first client certificate expires a few
// seconds in, meanwhile etcd's CA is rolled over (the client's bundle holds both CAs, the member
// and the client get certificates of the new CA, then the bundle holds the new CA alone), and
// every reconnection (the proxy cuts the connections) succeeds with what the files hold then.
func TestEtcdClientReloadsItsCertificateAndCA(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	write := func(name string, b ...[]byte) {
		t.Helper()
		var all []byte
		for _, p := range b {
			all = append(append(all, p...), '\n')
		}
		if err := os.WriteFile(path(name), all, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newCA := func() *certs.CA {
		t.Helper()
		ca, err := certs.NewCA("nodefence etcd CA", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return ca
	}
	issue := func(ca *certs.CA, base, cn string, validity time.Duration) {
		t.Helper()
		pair, err := ca.IssueURIs(cn, nil, []string{"127.0.0.1"}, validity)
		if err != nil {
			t.Fatal(err)
		}
		write(base+".crt", pair.CertPEM)
		write(base+".key", pair.KeyPEM)
	}
	oldCA, nextCA := newCA(), newCA()
	write("member-trust.crt", oldCA.CertPEM, nextCA.CertPEM) // etcd admits clients of both
	issue(oldCA, "member", "member", time.Hour)              // etcd reads its own files at every handshake
	const firstLifetime = 5 * time.Second
	issue(oldCA, "client", "nodefence-coordinator", firstLifetime)
	expires := time.Now().Add(firstLifetime)
	write("client-ca.crt", oldCA.CertPEM)

	endpoint := startLockedEtcd(t, lockedEtcd{trusted: path("member-trust.crt"), clientCertAuth: true, cert: path("member.crt"), key: path("member.key")})
	proxy, err := tcpproxy.Start(endpoint[len("https://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	access := EtcdAccess{CAFile: path("client-ca.crt"), CertFile: path("client.crt"), KeyFile: path("client.key")}
	cc, reloader, err := access.clientConfig([]string{"https://" + proxy.Addr()}, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(step string) {
		t.Helper()
		// A new connection: the proxy drops the current one.
		proxy.Cut()
		proxy.Restore()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		// A read is retried by the client until the new connection is up; the write then uses it.
		if _, err := cli.Get(ctx, "/nodefence/rotation"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if _, err := cli.Put(ctx, "/nodefence/rotation", step); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	put("start")
	write("client-ca.crt", oldCA.CertPEM, nextCA.CertPEM)
	issue(nextCA, "member", "member", time.Hour)
	issue(nextCA, "client", "nodefence-coordinator", time.Hour)
	time.Sleep(time.Until(expires) + time.Second)
	put("certificates of the new CA, the first client certificate expired")
	write("client-ca.crt", nextCA.CertPEM)
	time.Sleep(1100 * time.Millisecond) // past the reloader's check interval
	put("the new CA alone")
	if c, ca := reloader.Expiry(); time.Until(c) < 50*time.Minute || !ca.Equal(nextCA.Cert.NotAfter) {
		t.Fatalf("the reloader holds a certificate until %v and a CA until %v; want about an hour and the new CA's %v", c, ca, nextCA.Cert.NotAfter)
	}
}

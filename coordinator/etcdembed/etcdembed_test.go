package etcdembed_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/nodefence/nodefence/coordinator/etcdembed"
)

func start(t *testing.T, dir string) *etcdembed.Etcd {
	t.Helper()
	e, err := etcdembed.Start(etcdembed.Config{
		DataDir: filepath.Join(dir, "etcd"), SecretsDir: filepath.Join(dir, "secrets"), Prefix: "/nodefence",
		ClientListen: "127.0.0.1:0", PeerListen: "127.0.0.1:0", UnsafeNoFsync: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// try reads and writes one key with cc and returns both errors; a client that cannot even
// connect counts as two failures.
func try(t *testing.T, cc clientv3.Config, key string) (getErr, putErr error) {
	t.Helper()
	// Generous: a password login is a bcrypt check, seconds under -race on a loaded machine.
	cc.DialTimeout, cc.Logger = 5*time.Second, zap.NewNop()
	cli, err := clientv3.New(cc)
	if err != nil {
		return err, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, getErr = cli.Get(ctx, key)
	_, putErr = cli.Put(ctx, key, "forged")
	return getErr, putErr
}

func TestLockedMember(t *testing.T) {
	dir := t.TempDir()
	e := start(t, dir)
	files := e.Client
	tc, err := files.TLS()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(files.PasswordFile)
	if err != nil {
		t.Fatal(err)
	}
	password := strings.TrimSpace(string(pw))
	noCert := &tls.Config{RootCAs: tc.RootCAs, MinVersion: tls.VersionTLS12}
	ep := []string{e.Endpoint}
	if !strings.HasPrefix(e.Endpoint, "https://") {
		t.Fatalf("endpoint %s is not https", e.Endpoint)
	}
	const key = "/nodefence/fences/x"
	for _, c := range []struct {
		name string
		cc   clientv3.Config
	}{
		{"plaintext", clientv3.Config{Endpoints: []string{strings.Replace(e.Endpoint, "https://", "http://", 1)}}},
		{"TLS without a client certificate", clientv3.Config{Endpoints: ep, TLS: noCert}},
		{"TLS without a client certificate, with the password", clientv3.Config{Endpoints: ep, TLS: noCert, Username: etcdembed.User, Password: password}},
		{"client certificate without credentials", clientv3.Config{Endpoints: ep, TLS: tc}},
		{"client certificate, wrong password", clientv3.Config{Endpoints: ep, TLS: tc, Username: etcdembed.User, Password: "guess"}},
		{"client certificate, root without its password", clientv3.Config{Endpoints: ep, TLS: tc, Username: etcdembed.RootUser, Password: password}},
		{"a certificate from another CA", clientv3.Config{Endpoints: ep, TLS: otherCA(t, tc.RootCAs), Username: etcdembed.User, Password: password}},
	} {
		t.Run(c.name, func(t *testing.T) {
			getErr, putErr := try(t, c.cc, key)
			if getErr == nil || putErr == nil {
				t.Fatalf("get err = %v, put err = %v; want both refused", getErr, putErr)
			}
			t.Logf("refused: %v / %v", getErr, putErr)
		})
	}
	good := clientv3.Config{Endpoints: ep, TLS: tc, Username: files.Username, Password: password}
	if getErr, putErr := try(t, good, key); getErr != nil || putErr != nil {
		t.Fatalf("nodefence user under the prefix: get %v, put %v", getErr, putErr)
	}
	if getErr, putErr := try(t, good, "/elsewhere"); getErr == nil || putErr == nil {
		t.Fatalf("nodefence user outside the prefix: get %v, put %v; want both refused", getErr, putErr)
	}
	for _, f := range []string{files.CAFile, files.CertFile, files.KeyFile, files.PasswordFile, filepath.Join(filepath.Dir(files.CAFile), "ca.key")} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
	}

	// A restart keeps the lock and the coordinator's access.
	e.Close()
	e = start(t, dir)
	defer e.Close()
	good.Endpoints = []string{e.Endpoint}
	if getErr, putErr := try(t, good, key); getErr != nil || putErr != nil {
		t.Fatalf("after restart: get %v, put %v", getErr, putErr)
	}
	if getErr, putErr := try(t, clientv3.Config{Endpoints: good.Endpoints, TLS: tc}, key); getErr == nil || putErr == nil {
		t.Fatalf("after restart, certificate only: get %v, put %v; want both refused", getErr, putErr)
	}
}

// otherCA returns a client configuration trusting roots with a certificate from an unrelated CA.
func otherCA(t *testing.T, roots *x509.CertPool) *tls.Config {
	t.Helper()
	o := start(t, t.TempDir())
	defer o.Close()
	tc, err := o.Client.TLS()
	if err != nil {
		t.Fatal(err)
	}
	tc.RootCAs = roots
	return tc
}

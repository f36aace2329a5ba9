package attack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/manifests"
	"github.com/nodefence/nodefence/testbed/procs"
)

// The shipped etcd admits only the coordinators: a real etcd started with deploy/etcd.yaml's exact
// flags (only addresses and paths moved to this machine) and the certificates deploy/README.md
// issues (etcd's own CA for its members and the coordinators' etcd client; the nodefence CA for
// every nodefence identity) refuses every read and write by an agent's, a viewer's, an operator's, a
// driver's and a coordinator's nodefence certificate, and serves the coordinators' etcd
// certificate. Before etcd had its own CA, an agent certificate read every key, rewrote the
// evictions-paused flag and deleted the election key.
func TestShippedEtcdAdmitsOnlyCoordinators(t *testing.T) {
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	etcdBin := filepath.Join(assets, kubetest.EtcdBinary)
	if _, err := os.Stat(etcdBin); err != nil {
		t.Fatalf("the etcd binary (make kube-assets builds it): %v", err)
	}
	dir := t.TempDir()
	// The nodefence CA and the identities it signs (fencectl certs).
	ca, err := certs.NewCA("nodefence CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodefence := map[string]tls.Certificate{}
	for _, id := range []identity.Identity{{Role: identity.Agent, Name: "node-a"}, {Role: identity.Viewer, Name: "v"},
		{Role: identity.Operator, Name: "alice"}, {Role: identity.Driver, Name: "ipmi"}, {Role: identity.Coordinator, Name: "nodefence-coordinator"}} {
		pair, err := ca.Issue(id, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		nodefence[id.String()] = keyPair(t, pair)
	}
	// etcd's own CA, its member's and the coordinators' certificates (fencectl certs --etcd).
	eca, err := certs.NewCA("nodefence etcd CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	member, err := eca.IssueURIs("nodefence-etcd", nil, []string{"localhost", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	coord, err := eca.IssueURIs("nodefence-coordinator", nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Secret nodefence-etcd-tls, mounted at /etc/etcd/tls.
	secret := filepath.Join(dir, "etc", "etcd", "tls")
	for name, data := range map[string][]byte{"tls.crt": member.CertPEM, "tls.key": member.KeyPEM, "ca.crt": eca.CertPEM} {
		if err := os.MkdirAll(secret, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(secret, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	endpoint := startShippedEtcd(t, etcdBin, dir)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(eca.CertPEM)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The coordinators' etcd certificate works: the records, the pause flag, the election key.
	good := etcdKV(t, endpoint, roots, keyPair(t, coord))
	var err2 error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err2 = tryAll(ctx, good); err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Fatalf("the coordinators' etcd certificate: %v", err2)
	}
	for id, cert := range nodefence {
		kv := etcdKV(t, endpoint, roots, cert)
		for _, op := range etcdOps() {
			if err := op.do(ctx, kv); err == nil {
				t.Errorf("%s: %s was served by etcd", id, op.what)
			}
		}
	}
	if _, err := good.Range(ctx, &pb.RangeRequest{Key: []byte("/nodefence/zones/paused")}); err != nil {
		t.Fatalf("the coordinators lost etcd after the attempts: %v", err)
	}
}

// startShippedEtcd runs etcd with the args of deploy/etcd.yaml's container, its addresses on free
// 127.0.0.1 ports and its paths below root, and returns the client address.
func startShippedEtcd(t *testing.T, bin, root string) string {
	t.Helper()
	args := manifests.Args(t, "../../deploy/etcd.yaml", "etcd")[0]
	ports := make([]int, 3)
	for i := range ports {
		p, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	client, peer := fmt.Sprintf("https://127.0.0.1:%d", ports[0]), fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	moved := map[string]string{
		"--listen-client-urls": client, "--advertise-client-urls": client,
		"--listen-peer-urls": peer, "--initial-advertise-peer-urls": peer,
		"--initial-cluster":     "nodefence-etcd-0=" + peer,
		"--listen-metrics-urls": fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		"--data-dir":            filepath.Join(root, "data"),
		"--name":                "nodefence-etcd-0",
	}
	var out []string
	for _, a := range args {
		flag, _, _ := strings.Cut(a, "=")
		if v, ok := moved[flag]; ok {
			out = append(out, flag+"="+v)
			continue
		}
		out = append(out, strings.ReplaceAll(a, "=/etc/etcd/", "="+filepath.Join(root, "etc", "etcd")+"/"))
	}
	for _, must := range []string{"--client-cert-auth", "--trusted-ca-file=" + filepath.Join(root, "etc/etcd/tls/ca.crt"), "--peer-client-cert-auth"} {
		if !strings.Contains(strings.Join(out, " "), must) {
			t.Fatalf("deploy/etcd.yaml lost %s: %q", must, out)
		}
	}
	p, err := procs.Start("etcd", filepath.Join(root, "etcd.log"), bin, append(out, "--unsafe-no-fsync", "--log-level=warn")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	if err := p.WaitTCP(fmt.Sprintf("127.0.0.1:%d", ports[0]), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

func keyPair(t *testing.T, p certs.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// etcdKV is a bare etcd KV client with cert: no retries, no user.
func etcdKV(t *testing.T, addr string, roots *x509.CertPool, cert tls.Certificate) pb.KVClient {
	t.Helper()
	tc := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewKVClient(conn)
}

type etcdOp struct {
	what string
	do   func(context.Context, pb.KVClient) error
}

// etcdOps are the attack's reads and writes: every key, the evictions-paused flag, the election key.
func etcdOps() []etcdOp {
	call := func(f func(ctx context.Context, kv pb.KVClient) error) func(context.Context, pb.KVClient) error {
		return func(ctx context.Context, kv pb.KVClient) error {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			return f(ctx, kv)
		}
	}
	return []etcdOp{
		{"a read of every key", call(func(ctx context.Context, kv pb.KVClient) error {
			_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
			return err
		})},
		{"a write of the evictions-paused flag", call(func(ctx context.Context, kv pb.KVClient) error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("/nodefence/zones/paused"), Value: []byte("false")})
			return err
		})},
		{"a delete of the election keys", call(func(ctx context.Context, kv pb.KVClient) error {
			_, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("/nodefence/leader/"), RangeEnd: []byte("/nodefence/leader0")})
			return err
		})},
	}
}

// tryAll runs every op; nil when all were served.
func tryAll(ctx context.Context, kv pb.KVClient) error {
	for _, op := range etcdOps() {
		if err := op.do(ctx, kv); err != nil {
			return fmt.Errorf("%s: %w", op.what, err)
		}
	}
	return nil
}

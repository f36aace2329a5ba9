// Package etcdtest starts a real embedded etcd member for tests, on free 127.0.0.1 ports, with its
// data in the test's temporary directory.
package etcdtest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/nodefence/nodefence/coordinator/etcdembed"
)

// Start starts a member and a client; both are closed when the test ends.
func Start(t testing.TB) (endpoint string, cli *clientv3.Client) {
	t.Helper()
	e, err := etcdembed.Start(etcdembed.Config{DataDir: t.TempDir(), UnsafeNoFsync: true, Open: true})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return e.Endpoint, Client(t, e.Endpoint)
}

// StartQuota is Start with etcd's NOSPACE alarm at quota bytes of database.
func StartQuota(t testing.TB, quota int64) (endpoint string, cli *clientv3.Client) {
	t.Helper()
	e, err := etcdembed.Start(etcdembed.Config{DataDir: t.TempDir(), UnsafeNoFsync: true, Open: true, QuotaBackendBytes: quota})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return e.Endpoint, Client(t, e.Endpoint)
}

// Client returns a client for endpoint, closed when the test ends.
func Client(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	snapshotutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// restoreBump is the revision bump docs/operations.md prescribes: far more revisions than any
// nodefence installation writes between two backups, as the Kubernetes restore procedure uses.
const restoreBump = 1_000_000_000

// The backup and restore procedure of docs/operations.md, run against the embedded etcd of a real
// coordinator, a real IPMI driver and ipmi_sim. A fence is interrupted (the BMC fails every call),
// a snapshot is saved with the library etcdctl uses, the cluster keeps running (a second leader
// takes over and its epoch reaches the driver), then everything stops. A restore WITHOUT the
// revision bump gives the new leader an epoch below the driver's high-water mark: the driver
// refuses it as stale and the BMC stays on (safe, but stuck). A restore with etcdutl's
// --bump-revision and --mark-compacted resumes the fence to a confirmed read-back off, with an
// epoch the same, still-running driver accepts. The snapshot's in-flight operation was resolved
// (off) and then undone (on) after the backup: the driver refuses its resend as superseded
// instead of answering "confirmed off" from its table about a node that is on.
func TestBackupRestoreResumesInterruptedFence(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	if err := n.bmc.SetFault(ipmisim.FaultFail); err != nil {
		t.Fatal(err)
	}
	other := node{name: "node-2", password: "password", bmc: startBMC(t, "node-2")}
	driver := startDriver(t, t.TempDir()) // runs through every restore: its epochs persist
	cfgPath := writeConfig(t, driver, []node{n, other})
	// Keep retrying the unreachable BMC: the fence stays RUNNING across every restart below.
	policy := fencing.Policy{Retries: 100, Backoff: 20 * time.Millisecond, IsolationWait: time.Second, Polls: 3, PollInterval: 100 * time.Millisecond}
	start := func(id, dataDir string) *coordinator {
		return startCoordinator(t, app.Config{ID: id, FenceConfig: cfgPath, Fencing: policy, DataDir: dataDir,
			FenceOpTimeout: 2 * time.Second, EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 1. A fence under way while the BMC fails.
	dataA := t.TempDir()
	a := start("a", dataA)
	ca := conn(t, a.app.Addr())
	leaderReady(t, ca)
	epochA := a.app.Term().Epoch
	var id string
	wait.Until(t, 10*time.Second, "fence started", func() error {
		resp, err := coordv1.NewFenceServiceClient(ca).Fence(ctx, &coordv1.FenceRequest{Node: n.name, Reason: "backup test"})
		if err == nil {
			id = resp.Fence.Id
		}
		return err
	})
	epochA = waitOp(t, ca, id, "a failed driver call", failedSince(epochA)).Epoch

	// 2. etcdctl snapshot save, as root of the embedded etcd (its secrets under --data-dir).
	snap := filepath.Join(t.TempDir(), "nodefence.db")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), rootClientConfig(t, a), snap); err != nil {
		t.Fatalf("snapshot save: %v", err)
	}
	st, err := snapshotutl.NewV3(zap.NewNop()).Status(snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot at revision %d, epoch %d", st.Revision, epochA)
	// The cluster keeps working after the backup: an operator fences and unfences another node.
	// Then the BMC heals; the next leader (on the same data) completes the fence and an operator
	// unfences the node. The driver keeps the epoch of every call that succeeded (a failed call
	// takes its epoch back): that leader's is its high-water mark for node-1's BMC.
	fca := coordv1.NewFenceServiceClient(ca)
	for _, action := range []string{"fence", "unfence"} {
		var fid string
		if action == "fence" {
			r, err := fca.Fence(ctx, &coordv1.FenceRequest{Node: other.name, Reason: "after the backup"})
			if err != nil {
				t.Fatal(err)
			}
			fid = r.Fence.Id
		} else {
			r, err := fca.Unfence(ctx, &coordv1.UnfenceRequest{Node: other.name})
			if err != nil {
				t.Fatal(err)
			}
			fid = r.Fence.Id
		}
		if f := watchUntilFinal(t, ctx, fca, fid); f[len(f)-1].Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
			t.Fatalf("%s %s: %v", action, other.name, f[len(f)-1])
		}
	}
	a.stop()
	if err := n.bmc.SetFault(ipmisim.FaultNone); err != nil {
		t.Fatal(err)
	}
	b2 := start("b2", dataA)
	cb2 := conn(t, b2.app.Addr())
	leaderReady(t, cb2)
	fc2 := coordv1.NewFenceServiceClient(cb2)
	fenced := watchUntilFinal(t, ctx, fc2, id)
	if f := fenced[len(fenced)-1]; f.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("fence after the BMC healed: %v", f)
	}
	un, err := fc2.Unfence(ctx, &coordv1.UnfenceRequest{Node: n.name}) // b2 leads: it ran the fence
	if err != nil {
		t.Fatal(err)
	}
	unfenced := watchUntilFinal(t, ctx, fc2, un.Fence.Id)
	if f := unfenced[len(unfenced)-1]; f.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("unfence: %v", f)
	}
	b2.stop()
	mark := max(maxConfirmedEpoch(fenced[len(fenced)-1]), maxConfirmedEpoch(unfenced[len(unfenced)-1]))
	t.Logf("epochs: a %d, the driver's mark %d", epochA, mark)

	// 3. Restore WITHOUT the revision bump: the new leader's epoch is below the driver's mark, and
	// the driver refuses it although the BMC answers.
	c := start("c", restoreEmbedded(t, snap, dataA, 0))
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	op := waitOp(t, cc, id, "a driver call refused as a stale epoch", func(op *coordv1.Operation) bool {
		return strings.Contains(op.Error, "FailedPrecondition: stale epoch")
	})
	t.Logf("without --bump-revision: %s", op)
	if op.Epoch >= mark {
		t.Fatalf("refused epoch %d >= the driver's mark %d", op.Epoch, mark)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("after the stale restore: ipmitool = %q, %v; want on (the driver refused)", p, err)
	}
	c.stop()

	// 4. Restore with --bump-revision and --mark-compacted: the fence completes.
	d := start("d", restoreEmbedded(t, snap, dataA, restoreBump))
	cd := conn(t, d.app.Addr())
	leaderReady(t, cd)
	states := watchUntilFinal(t, ctx, coordv1.NewFenceServiceClient(cd), id)
	final := states[len(states)-1]
	last := final.Operations[len(final.Operations)-1]
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.ConfirmedOffAt == nil ||
		last.Result != coordv1.OperationResult_OPERATION_RESULT_CONFIRMED || last.Epoch <= mark {
		t.Fatalf("after the restore: fence %s (confirmed off %v), last operation %v; want DONE, confirmed with an epoch above %d",
			final.Status, final.ConfirmedOffAt, last, mark)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("after the restore: ipmitool = %q, %v; want off", p, err)
	}
}

// waitOp waits until fence id has an operation match accepts, and returns it.
func waitOp(t *testing.T, cc *grpc.ClientConn, id, what string, match func(*coordv1.Operation) bool) *coordv1.Operation {
	t.Helper()
	var found *coordv1.Operation
	wait.Until(t, 20*time.Second, what, func() error {
		r, err := coordv1.NewFenceServiceClient(cc).GetFence(context.Background(), &coordv1.GetFenceRequest{Id: id})
		if err != nil {
			return err
		}
		for _, op := range r.Fence.Operations {
			if match(op) {
				found = op
				return nil
			}
		}
		return fmt.Errorf("fence %s: %v", r.Fence.Status, r.Fence.Operations)
	})
	return found
}

// maxConfirmedEpoch is the highest epoch of f's confirmed operations: the driver kept it.
func maxConfirmedEpoch(f *coordv1.NodeFence) int64 {
	var m int64
	for _, op := range f.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
			m = max(m, op.Epoch)
		}
	}
	return m
}

// failedSince matches a failed operation of an epoch at least epoch (a loaded machine may see a
// leader re-elected with a higher one).
func failedSince(epoch int64) func(*coordv1.Operation) bool {
	return func(op *coordv1.Operation) bool {
		return op.Epoch >= epoch && op.Result == coordv1.OperationResult_OPERATION_RESULT_FAILED
	}
}

// rootClientConfig is what `etcdctl --cacert --cert --key --user root` presents to the embedded
// etcd of c: snapshots need etcd's root user.
func rootClientConfig(t *testing.T, c *coordinator) clientv3.Config {
	t.Helper()
	acc := c.app.EtcdAccess()
	tc, err := etcdembed.Files{CAFile: acc.CAFile, CertFile: acc.CertFile, KeyFile: acc.KeyFile}.TLS()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(filepath.Join(filepath.Dir(acc.CAFile), etcdembed.RootUser+".password"))
	if err != nil {
		t.Fatal(err)
	}
	return clientv3.Config{Endpoints: []string{c.app.EtcdEndpoint()}, TLS: tc, Username: etcdembed.RootUser,
		Password: strings.TrimSpace(string(pw)), DialTimeout: 10 * time.Second, Logger: zap.NewNop()}
}

// restoreEmbedded is docs/operations.md's restore of the embedded etcd: `etcdutl snapshot restore`
// into <new data-dir>/etcd (with --bump-revision bump --mark-compacted unless bump is 0) and the
// backed-up etcd-secrets beside it. It returns the new --data-dir.
func restoreEmbedded(t *testing.T, snap, oldDataDir string, bump uint64) string {
	t.Helper()
	dir := t.TempDir()
	err := snapshotutl.NewV3(zap.NewNop()).Restore(snapshotutl.RestoreConfig{
		SnapshotPath: snap, Name: "nodefence", OutputDataDir: filepath.Join(dir, "etcd"),
		PeerURLs: []string{"https://127.0.0.1:2380"}, InitialCluster: "nodefence=https://127.0.0.1:2380",
		InitialClusterToken: "etcd-cluster", RevisionBump: bump, MarkCompacted: bump > 0,
	})
	if err != nil {
		t.Fatalf("snapshot restore: %v", err)
	}
	// cp -a: the secrets stay 0600 in a 0700 directory.
	from, to := filepath.Join(oldDataDir, "etcd-secrets"), filepath.Join(dir, "etcd-secrets")
	if err := os.Mkdir(to, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err == nil {
			err = os.WriteFile(filepath.Join(to, e.Name()), b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Package app wires the coordinator: etcd (embedded or external), the gRPC server, the election loop,
// and per term the engine loop, the fence runner, the device checks, the fence history's upkeep and,
// in Kubernetes mode, the Kubernetes mirror. main and the tests both run it.
//
// Where things are:
//
//	config.go   Config, its flags, every default (DefaultConfig) and Validate
//	wiring.go   New: everything that lives as long as the replica, built before Run
//	term.go     Run's election loop and one term's parts (newTerm builds them all, start runs them)
//	app.go      the App, its accessors, kdump's hooks and the automatic fence's record
//	etcd.go     etcd access (TLS, user) and the client's configuration
//	kube.go     Kubernetes mode: fence ConfigMaps, Secrets, the witness, the reconciler per term
package app

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kdump"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/job"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// App is a running coordinator replica.
type App struct {
	cfg     Config
	log     *slog.Logger
	fenceCf atomic.Pointer[fenceconfig.Config]
	etcd    *etcdembed.Etcd
	cli     *clientv3.Client
	etcdTLS *tlsfiles.Reloader // the etcd client's certificate and CA (nil: plaintext)
	// lock is what Run's check of etcd's lock needs.
	lock    etcdLockCheck
	store   *store.Store
	srv     *server.Server
	drivers *fencing.Drivers
	elector *leader.Elector
	// follower names a verified leader to clients of a replica that does not lead.
	follower  *leader.Follower
	advertise string

	metrics   *loop.Metrics
	kdump     *kdump.Listener
	admission *admissionServer
	kube      *kubeMode
	proof     *proof
	mu        sync.Mutex
	leading   *api.Leading
	fenceSrv  *api.FenceServer // remediation requests start fences through it (kube.go)
	fenceMx   *fenceMetrics
	devices   *deviceChecks
	storeG    *storeGuard     // storeguard.go
	observeMx *observeMetrics // observe.go
	closeOnce sync.Once
	// jobs owns the goroutines that live as long as Run (jobs.go); each term has its own group.
	jobs *job.Group
	// termStopped, when set (tests), is called once a term's jobs have all returned, before the
	// next campaign.
	termStopped func(epoch int64)
}

// fences is the current fence configuration.
func (a *App) fences() *fenceconfig.Config { return a.fenceCf.Load() }

// nodeByAddress names the configured node with the address.
func (a *App) nodeByAddress(ip netip.Addr) (string, bool) {
	for _, name := range a.fences().NodeNames() {
		for _, s := range a.fences().Nodes[name].Addresses {
			if addr, err := netip.ParseAddr(s); err == nil && addr.Unmap() == ip {
				return name, true
			}
		}
	}
	return "", false
}

// kdumpSeen hands a fence_kdump message to the leader's engine (followers ignore it).
func (a *App) kdumpSeen(node string, from netip.Addr, at time.Time) {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(l.Term.Context(), time.Second)
	defer cancel()
	if err := l.Loop.Step(ctx, engine.Kdump{Node: node, At: at}); err != nil {
		a.log.Warn("kdump message not applied", "node", node, "from", from, "err", err)
	}
}

// agentLive reports whether a witness of the node reaches us (engine.Reaching: its agent, or in
// Kubernetes mode its kubelet, heard within the grace period, connected or between two streams):
// a fence_kdump message for such a node is dropped. Followers answer false; they drop kdump
// messages anyway.
func (a *App) agentLive(node string) bool {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(l.Term.Context(), time.Second)
	defer cancel()
	live := true // when the engine cannot answer, assume the witness is alive: kdump is only evidence
	_ = l.Loop.Query(ctx, func(e *engine.Engine) { live = e.Reaching(node, a.now()) })
	return live
}

// KdumpAddr is the kdump listener's address ("" when off).
func (a *App) KdumpAddr() string {
	if a.kdump == nil {
		return ""
	}
	return a.kdump.Addr()
}

// Addr is the gRPC address.
func (a *App) Addr() string { return a.srv.Addr() }

// MetricsAddr is the bound /metrics address ("" when metrics are off).
func (a *App) MetricsAddr() string { return a.srv.MetricsAddr() }

// EtcdEndpoint is the embedded etcd's client URL ("" with external etcd).
func (a *App) EtcdEndpoint() string {
	if a.etcd == nil {
		return ""
	}
	return a.etcd.Endpoint
}

// EtcdAccess is what another process needs to use the embedded etcd (zero with external etcd).
func (a *App) EtcdAccess() EtcdAccess {
	if a.etcd == nil {
		return EtcdAccess{}
	}
	return embeddedAccess(a.etcd.Client)
}

// Etcd is the app's etcd client.
func (a *App) Etcd() *clientv3.Client { return a.cli }

// Store is the app's record store.
func (a *App) Store() *store.Store { return a.store }

// Close stops the server, the drivers' connections, the etcd client and the embedded etcd.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		if a.srv != nil {
			a.srv.Stop()
		}
		if a.admission != nil {
			a.admission.close()
		}
		a.drivers.Close()
		if a.cli != nil {
			a.cli.Close()
		}
		a.closeEtcd()
	})
}

func (a *App) closeEtcd() {
	if a.etcd != nil {
		a.etcd.Close()
		a.etcd = nil
	}
}

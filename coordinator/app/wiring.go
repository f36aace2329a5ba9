package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kdump"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// kubeConfigTimeout bounds the first read of the fence ConfigMaps at start.
const kubeConfigTimeout = 30 * time.Second

// New validates cfg, loads the fence configuration, starts etcd if embedded, binds the server and
// builds everything that lives as long as the replica: the election, the metrics, the kdump
// listener and the API. Run starts serving and campaigning; each term's parts are built by
// newTerm.
func New(cfg Config, log *slog.Logger) (*App, error) {
	cfg.SetDefaults()
	fences, err := loadConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.PodEvictionTimeout != 0 {
		log.Warn("--pod-eviction-timeout is deprecated and has no effect: Kubernetes removed it in 1.27; taint-based eviction (tolerationSeconds) decides when pods leave a not-ready node")
	}
	a := &App{cfg: cfg, log: log, drivers: fencing.NewDrivers(cfg.DriverTLS, log)}
	logFenceMode(cfg, log)
	a.fenceCf.Store(fences)
	if cfg.kubeMode() {
		if err := a.startKube(); err != nil {
			return nil, err
		}
	}
	if err := a.connectEtcd(); err != nil {
		return nil, err
	}
	if err := a.bindServer(); err != nil {
		a.Close()
		return nil, err
	}
	if cfg.AdmissionListen != "" {
		if err := a.listenAdmission(); err != nil {
			a.Close()
			return nil, err
		}
	}
	if cfg.KdumpListen != "" {
		if a.kdump, err = kdump.Listen(cfg.KdumpListen); err != nil {
			a.Close()
			return nil, err
		}
		a.kdump.Log, a.kdump.Resolve, a.kdump.Seen, a.kdump.Live, a.kdump.Now = log, a.nodeByAddress, a.kdumpSeen, a.agentLive, a.now
		a.kdump.Messages = kdump.NewMessageCounter(a.srv.Registry)
	}
	a.registerAPI()
	return a, nil
}

// loadConfig validates cfg and reads the standalone fence configuration (nil in Kubernetes mode
// without --config), returning every problem at once.
func loadConfig(cfg Config) (*fenceconfig.Config, error) {
	errs := cfg.Validate()
	var fences *fenceconfig.Config
	if cfg.FenceConfig != "" {
		var err error
		if fences, err = fenceconfig.Load(cfg.FenceConfig); err != nil {
			var inv fault.Invalid
			if errors.As(err, &inv) {
				for _, fe := range inv {
					errs = append(errs, fmt.Errorf("--config %s: %s", cfg.FenceConfig, fe.Error()))
				}
			} else {
				errs = append(errs, fmt.Errorf("--config: %w", err))
			}
		}
	}
	return fences, errors.Join(errs...)
}

// startKube connects the Kubernetes mode and, without --config, reads the fence ConfigMaps.
func (a *App) startKube() error {
	rc, err := kubeRESTConfig(a.cfg)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	if a.kube, err = newKubeMode(a, rc); err != nil {
		return err
	}
	if a.fences() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeConfigTimeout)
	defer cancel()
	c, err := a.kube.loadConfig(ctx)
	if err != nil {
		return fmt.Errorf("fence ConfigMaps in namespace %s: %w", a.cfg.FenceNamespace, err)
	}
	a.fenceCf.Store(c)
	return nil
}

// connectEtcd starts the embedded etcd (without --etcd-endpoints) and connects the client and the
// store.
func (a *App) connectEtcd() error {
	cfg := a.cfg
	endpoints, access := cfg.EtcdEndpoints, cfg.EtcdAccess
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		e, err := etcdembed.Start(etcdembed.Config{
			Name: "nodefence", DataDir: filepath.Join(cfg.DataDir, "etcd"),
			ClientListen: cfg.EtcdClientListen, PeerListen: cfg.EtcdPeerListen, UnsafeNoFsync: cfg.EtcdUnsafeNoFsync, Log: a.log, QuotaBackendBytes: cfg.EtcdQuotaBackendBytes,
			SecretsDir: filepath.Join(cfg.DataDir, "etcd-secrets"), Prefix: cfg.EtcdPrefix,
		})
		if err != nil {
			return err
		}
		a.etcd = e
		endpoints, access = []string{e.Endpoint}, embeddedAccess(e.Client)
		a.log.Info("embedded etcd ready", "endpoint", e.Endpoint, "dir", cfg.DataDir, "secrets", filepath.Dir(e.Client.CAFile))
	}
	cc, etcdTLS, err := access.clientConfig(endpoints, a.log)
	if err != nil {
		a.closeEtcd()
		return err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		a.closeEtcd()
		return fmt.Errorf("etcd client: %w", err)
	}
	a.cli, a.etcdTLS = cli, etcdTLS
	a.lock = etcdLockCheck{endpoints: endpoints, access: access, prefix: cfg.EtcdPrefix}
	if st := cfg.Server.TLS; !st.Insecure {
		a.lock.nodefenceCert, a.lock.nodefenceKey, a.lock.nodefenceCA = st.CertFile, st.KeyFile, st.CAFile
	}
	a.store = store.New(cli, cfg.EtcdPrefix)
	a.store.Log = a.log
	return nil
}

// bindServer binds the gRPC server and builds what hangs on it: the election (which advertises
// the server's address) and the metrics.
func (a *App) bindServer() error {
	sc := a.cfg.Server
	// Agent streams carry every heartbeat and sample: observed per call, not per message.
	sc.BusyStreams = append(sc.BusyStreams, agentv1.AgentService_Connect_FullMethodName)
	srv, err := server.New(sc, a.log)
	if err != nil {
		return err
	}
	a.srv = srv
	advertise := a.cfg.Advertise
	if advertise == "" {
		advertise = srv.Addr()
	}
	a.elector = leader.NewElector(a.cli, a.store.LeaderPrefix(), leader.Info{ID: a.cfg.ID, Address: advertise}, int(a.cfg.ElectionTTL/time.Second), a.log)
	a.follower, a.advertise = leader.NewFollower(a.cli, a.store.LeaderPrefix(), a.cfg.ID, a.log), advertise
	a.metrics = loop.NewMetrics(srv.Registry)
	driverTLS, err := a.drivers.Certs()
	if err != nil {
		return fmt.Errorf("--driver-tls-*: %w", err)
	}
	srv.Certs.Add(tlsfiles.RoleClient, driverTLS)
	srv.Certs.Add(tlsfiles.RoleEtcdClient, a.etcdTLS)
	a.proof = newProof(a, srv.Registry)
	srv.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodefence_store_corrupt_records_total",
		Help: "Stored fence record versions that could not be decoded and were skipped (each is logged once)."},
		func() float64 { return float64(a.store.CorruptRecords()) }))
	srv.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodefence_agent_registrations_held_total",
		Help: "Changed node registrations (agent hellos) not written because their node's limit was spent; the node's next hello writes its newest."},
		func() float64 { return float64(a.store.RegistrationsHeld()) }))
	srv.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodefence_agent_registrations_failed_total",
		Help: "Node registrations whose batched etcd write failed (logged); the node's next hello writes it."},
		func() float64 { return float64(a.store.RegistrationsFailed()) }))
	a.fenceMx = newFenceMetrics(srv.Registry, a.Term)
	a.observeMx = newObserveMetrics(srv.Registry)
	a.storeG = newStoreGuard(srv.Registry)
	a.elector.OnUnwritable = a.storeG.onUnwritable
	a.devices = newDeviceChecks(srv.Registry)
	srv.Registry.MustRegister(newNodeMetrics(a))
	srv.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodefence_remediations_overdue",
		Help: "NodeFenceRemediations older than 48 h (the leader's count; 0 elsewhere and outside Kubernetes mode): a node a health checker still finds unhealthy after two days."},
		func() float64 {
			if a.kube == nil {
				return 0
			}
			return float64(a.kube.rem.Load().Overdue())
		}))
	return nil
}

// registerAPI registers the coordinator's gRPC services on the server.
func (a *App) registerAPI() {
	deps := &api.Deps{
		Leadership: a, Store: a.store, Config: a.fences,
		HeartbeatInterval: a.cfg.AgentHeartbeatInterval, SampleInterval: a.cfg.AgentSampleInterval,
		KnownNode: a.knownNode, Now: a.now, CheckDevices: a.checkNode, LiveConfig: a.liveConfig,
	}
	if a.kube != nil {
		deps.KubeletReporting = a.kubeletReporting
		deps.Maintenance = a.kube
	}
	a.fenceSrv = &api.FenceServer{Deps: deps}
	coordv1.RegisterFenceServiceServer(a.srv.GRPC, a.fenceSrv)
	coordv1.RegisterClusterServiceServer(a.srv.GRPC, &api.ClusterServer{Deps: deps})
	agentv1.RegisterAgentServiceServer(a.srv.GRPC, &api.AgentServer{Deps: deps})
}

// Package app wires the coordinator: etcd (embedded or external), the gRPC server, the election loop,
// and per term the engine loop, the fence runner, the device checks, the fence history's upkeep and,
// in Kubernetes mode, the Kubernetes mirror. main and the tests both run it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/config"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kdump"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/server"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// App is a running coordinator replica.
type App struct {
	cfg     Config
	log     *slog.Logger
	fenceCf atomic.Pointer[config.Config]
	etcd    *etcdembed.Etcd
	cli     *clientv3.Client
	store   *store.Store
	srv     *server.Server
	drivers *fencing.Drivers
	elector *leader.Elector
	// follower names a verified leader to clients of a replica that does not lead.
	follower  *leader.Follower
	advertise string

	metrics   *loop.Metrics
	kdump     *kdump.Listener
	kube      *kubeMode
	proof     *proof
	mu        sync.Mutex
	leading   *api.Leading
	fenceMx   *fenceMetrics
	devices   *deviceChecks
	closeOnce sync.Once
}

// New validates cfg, loads the fence configuration, starts etcd if embedded, and binds the server.
// Run starts serving.
func New(cfg Config, log *slog.Logger) (*App, error) {
	cfg.SetDefaults()
	errs := cfg.Validate()
	var fences *config.Config
	if cfg.FenceConfig != "" {
		var err error
		if fences, err = config.Load(cfg.FenceConfig); err != nil {
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
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.PodEvictionTimeout != 0 {
		log.Warn("--pod-eviction-timeout is deprecated and has no effect: Kubernetes removed it in 1.27; taint-based eviction (tolerationSeconds) decides when pods leave a not-ready node")
	}
	a := &App{cfg: cfg, log: log, drivers: fencing.NewDrivers(cfg.DriverTLS)}
	a.fenceCf.Store(fences)
	if cfg.kubeMode() {
		rc, err := kubeRESTConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		if a.kube, err = newKubeMode(a, rc); err != nil {
			return nil, err
		}
		if fences == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			c, err := a.kube.loadConfig(ctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("fence ConfigMaps in namespace %s: %w", cfg.FenceNamespace, err)
			}
			a.fenceCf.Store(c)
		}
	}
	endpoints, access := cfg.EtcdEndpoints, cfg.EtcdAccess
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("--data-dir: %w", err)
		}
		e, err := etcdembed.Start(etcdembed.Config{
			Name: "nodefence", DataDir: filepath.Join(cfg.DataDir, "etcd"),
			ClientListen: cfg.EtcdClientListen, PeerListen: cfg.EtcdPeerListen, UnsafeNoFsync: cfg.EtcdUnsafeNoFsync, Log: log,
			SecretsDir: filepath.Join(cfg.DataDir, "etcd-secrets"), Prefix: cfg.EtcdPrefix,
		})
		if err != nil {
			return nil, err
		}
		a.etcd = e
		endpoints, access = []string{e.Endpoint}, embeddedAccess(e.Client)
		log.Info("embedded etcd ready", "endpoint", e.Endpoint, "dir", cfg.DataDir, "secrets", filepath.Dir(e.Client.CAFile))
	}
	cc, err := access.clientConfig(endpoints, log)
	if err != nil {
		a.closeEtcd()
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		a.closeEtcd()
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	a.cli = cli
	a.store = store.New(cli, cfg.EtcdPrefix)
	a.store.Log = log
	// Agent streams carry every heartbeat and sample: observed per call, not per message.
	cfg.Server.BusyStreams = append(cfg.Server.BusyStreams, agentv1.AgentService_Connect_FullMethodName)
	srv, err := server.New(cfg.Server, log)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.srv = srv
	advertise := cfg.Advertise
	if advertise == "" {
		advertise = srv.Addr()
	}
	a.elector = leader.NewElector(cli, a.store.LeaderPrefix(), leader.Info{ID: cfg.ID, Address: advertise}, int(cfg.ElectionTTL/time.Second), log)
	a.follower, a.advertise = leader.NewFollower(cli, a.store.LeaderPrefix(), cfg.ID, log), advertise
	a.metrics = loop.NewMetrics(srv.Registry)
	a.proof = newProof(a, srv.Registry)
	srv.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "nodefence_store_corrupt_records_total",
		Help: "Stored fence record versions that could not be decoded and were skipped (each is logged once)."},
		func() float64 { return float64(a.store.CorruptRecords()) }))
	a.fenceMx = newFenceMetrics(srv.Registry, a.Term)
	a.devices = newDeviceChecks(srv.Registry)
	deps := &api.Deps{
		Leadership: a, Store: a.store, Etcd: cli, Config: a.fences,
		HeartbeatInterval: cfg.AgentHeartbeatInterval, SampleInterval: cfg.AgentSampleInterval,
		KnownNode: a.knownNode,
	}
	if a.kube != nil {
		deps.KubeletReporting = a.kubeletReporting
	}
	if cfg.KdumpListen != "" {
		if a.kdump, err = kdump.Listen(cfg.KdumpListen); err != nil {
			a.Close()
			return nil, err
		}
		a.kdump.Log, a.kdump.Resolve, a.kdump.Seen, a.kdump.Live = log, a.nodeByAddress, a.kdumpSeen, a.agentLive
		a.kdump.Messages = kdump.NewMessageCounter(srv.Registry)
	}
	coordv1.RegisterFenceServiceServer(srv.GRPC, &api.FenceServer{Deps: deps})
	coordv1.RegisterClusterServiceServer(srv.GRPC, &api.ClusterServer{Deps: deps})
	agentv1.RegisterAgentServiceServer(srv.GRPC, &api.AgentServer{Deps: deps})
	return a, nil
}

// fences is the current fence configuration.
func (a *App) fences() *config.Config { return a.fenceCf.Load() }

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

// agentLive reports whether a witness of the node is alive: its agent streaming to this leader
// (connected and heard within five heartbeat intervals, at least 5 s) or, in Kubernetes mode, its
// kubelet's Lease renewed within the monitor grace period. A fence_kdump message never overrides
// such a witness. Followers answer false; they drop kdump messages anyway.
func (a *App) agentLive(node string) bool {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l == nil {
		return false
	}
	window := max(5*a.cfg.AgentHeartbeatInterval, 5*time.Second)
	ctx, cancel := context.WithTimeout(l.Term.Context(), time.Second)
	defer cancel()
	live := true // when the engine cannot answer, assume the witness is alive: kdump is only evidence
	_ = l.Loop.Query(ctx, func(e *engine.Engine) {
		n := e.Node(node)
		agent := n != nil && n.Connected && n.LastSeen != nil && time.Since(n.LastSeen.AsTime()) < window
		// Kubernetes mode: a kubelet whose Lease was renewed within the monitor grace period is a
		// live witness too.
		kubelet := n != nil && n.KubeletLastSeen != nil && time.Since(n.KubeletLastSeen.AsTime()) < a.cfg.Engine.NodeMonitorGracePeriod
		live = agent || kubelet
	})
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

// Leading implements api.Leadership.
func (a *App) Leading(ctx context.Context) (*api.Leading, error) {
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	if l != nil && l.Term.Context().Err() == nil {
		return l, nil
	}
	v := a.follower.View(ctx)
	switch {
	case v.Err != nil:
		return nil, fmt.Errorf("not the leader, and this coordinator cannot reach etcd to name one; try another: %w", fault.ErrUnreachable)
	case !v.Found || v.Leader.ID == a.cfg.ID:
		return nil, &fault.NotLeaderError{}
	case !v.Answers:
		return nil, fmt.Errorf("not the leader; the leader %s at %s does not answer, an election is under way; retry shortly: %w",
			v.Leader.ID, v.Leader.Address, fault.ErrUnreachable)
	}
	return nil, &fault.NotLeaderError{LeaderID: v.Leader.ID, LeaderAddress: v.Leader.Address}
}

// etcdClientConfig is the etcd client's configuration: keepalive pings find a connection that a
// partition left dead (etcd refuses pings more often than every 5 s), and every unary call without
// a deadline of its own gets one, so no etcd read or write can block a coordinator for ever.
func etcdClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 6 * time.Second, DialKeepAliveTimeout: 3 * time.Second, PermitWithoutStream: true,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if _, ok := ctx.Deadline(); !ok {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, etcdCallTimeout)
					defer cancel()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	}
}

// etcdCallTimeout is the deadline of an etcd call made without one (listing many records is the
// slowest; the election's own calls have leader.CallTimeout).
const etcdCallTimeout = 10 * time.Second

// Term returns the current leadership term, or nil when not leading.
func (a *App) Term() *leader.Term {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.leading == nil || a.leading.Term.Context().Err() != nil {
		return nil
	}
	return a.leading.Term
}

// Run serves and campaigns until ctx ends, then stops everything it started.
func (a *App) Run(ctx context.Context) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.srv.Serve() }()
	a.srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if a.kube != nil {
		go a.kube.run(ctx)
	}
	if a.kdump != nil {
		go func() {
			if err := a.kdump.Run(ctx); err != nil {
				a.log.Error("kdump listener stopped", "err", err)
			}
		}()
	}
	defer a.Close()
	go a.follower.Run(ctx, 100*time.Millisecond)
	for ctx.Err() == nil {
		select {
		case err := <-serveErr:
			return fmt.Errorf("grpc server: %w", err)
		default:
		}
		var term *leader.Term
		err := a.reachable(ctx)
		if err == nil {
			term, err = a.elector.Campaign(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			a.log.Warn("campaign failed, retrying", "err", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
			continue
		}
		a.lead(term)
		select {
		case <-term.Context().Done():
			a.log.Warn("leadership term ended", "epoch", term.Epoch)
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = term.Resign(rctx)
			cancel()
		}
		a.mu.Lock()
		a.leading = nil
		a.mu.Unlock()
		a.fenceMx.reset()
	}
	return nil
}

// reachable checks that this replica's advertised address accepts connections before it campaigns:
// other replicas remove the election key of a leader whose address refuses them.
func (a *App) reachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", a.advertise)
	if err != nil {
		return fmt.Errorf("--advertise %s does not accept connections, not campaigning: %w", a.advertise, err)
	}
	return c.Close()
}

// lead sets up one term: an engine loop (every node gets a fresh grace period; persisted state is
// restored), a runner that resumes every active fence record, the device checks, the history's
// index and pruning, and in Kubernetes mode the mirror's term.
func (a *App) lead(term *leader.Term) {
	var initial []engine.Input
	now := time.Now()
	for _, n := range a.fences().NodeNames() {
		nc := a.fences().Nodes[n]
		initial = append(initial, engine.Configured{Node: n, Region: nc.Region, Zone: nc.Zone, Fenceable: true, At: now})
	}
	var runner *fencing.Runner
	lp := loop.New(loop.Config{
		Engine: a.cfg.Engine, Term: term, Etcd: a.cli, Prefix: a.cfg.EtcdPrefix,
		Initial: initial, Metrics: a.metrics, Log: a.log,
		Audit: func(ev engine.Event) clientv3.Op {
			return a.store.AuditOp(ev.At, term.Epoch, ev.Node, ev.Kind, ev.Text)
		},
		OnReady: func(rd engine.Ready) {
			for _, f := range rd.Fences {
				go a.autoFence(term, runner, f)
			}
			if a.kube != nil {
				a.kube.onReady(rd)
			}
		},
	})
	go func() {
		if err := lp.Run(term.Context()); err != nil {
			a.log.Error("engine loop stopped; resigning", "err", err)
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = term.Resign(rctx)
			cancel()
		}
	}()
	var secrets config.SecretReader
	if a.kube != nil {
		secrets = a.kube.secret
	}
	runner = &fencing.Runner{Store: a.store, Secrets: secrets, Term: term, Config: a.fences, Drivers: a.drivers, OpTimeout: a.cfg.FenceOpTimeout,
		Policy: a.cfg.Fencing, Log: a.log, OnChange: func(f *coordv1.NodeFence) { a.fenceChanged(term, f) },
		Facts: func(ctx context.Context, node string) (bool, time.Time) {
			var ready bool
			var kdumpUntil time.Time
			_ = lp.Query(ctx, func(e *engine.Engine) {
				n := e.Node(node)
				ready = n != nil && n.Readiness == coordv1.Readiness_READINESS_READY
				kdumpUntil = e.KdumpUntil(node)
			})
			return ready, kdumpUntil
		}}
	a.mu.Lock()
	a.leading = &api.Leading{Term: term, Runner: runner, Loop: lp}
	a.mu.Unlock()
	go a.devices.run(term.Context(), a, secrets, a.cfg.DeviceCheckInterval)
	if n, err := a.store.IndexHistory(term.Context(), term); err != nil {
		a.log.Error("cannot index the fence history; older records are missing from listings until the next term", "err", err)
	} else if n > 0 {
		a.log.Info("indexed the fence history by time", "records", n)
	}
	go a.pruneHistory(term)
	if a.kube != nil {
		a.kube.startTerm(term, lp)
	}
	active, err := a.store.ActiveFences(term.Context())
	if err != nil {
		a.log.Error("cannot list records to resume; they resume at the next term", "err", err)
		return
	}
	for _, f := range active {
		a.log.Info("resuming fence record", "fence", f.Id, "node", f.Node, "status", f.Status.String())
		runner.Start(f.Id)
	}
}

// fenceChanged audits a fence record's new version and observes its stage durations.
func (a *App) fenceChanged(term *leader.Term, f *coordv1.NodeFence) {
	text := fmt.Sprintf("fence %s (%s, attempt %d): %s %s", f.Id, cli.EnumWord(f.Action.String()), f.Retries+1,
		cli.EnumWord(f.Step.String()), cli.EnumWord(f.Status.String()))
	if n := len(f.Operations); n > 0 {
		op := f.Operations[n-1]
		text += fmt.Sprintf("; %s %s via %s: %s", op.Method, op.Action, op.Driver, cli.EnumWord(op.Result.String()))
		if op.Error != "" {
			text += " (" + op.Error + ")"
		}
	}
	if f.FinishedAt != nil {
		text += "; finished"
		if f.Error != "" {
			text += ": " + f.Error
		}
	}
	a.audit(term, f.Node, "fence", text)
	a.metrics.ObserveFence(f)
	a.proof.observe(term, f)
	a.fenceMx.observe(f)
	if a.kube != nil {
		a.kube.onFence(f)
	}
}

// audit appends one entry to the audit trail under the term's epoch.
func (a *App) audit(term *leader.Term, node, kind, text string) {
	ctx, cancel := context.WithTimeout(term.Context(), 5*time.Second)
	defer cancel()
	if _, err := term.Txn(ctx, nil, a.store.AuditOp(time.Now(), term.Epoch, node, kind, text)); err != nil {
		a.log.Warn("audit entry not written", "node", node, "kind", kind, "err", err)
	}
}

// autoFence starts the engine's automatic fence request: a record with the engine's evidence and
// the node's configured delay. It runs on a goroutine of its own, started from the loop's OnReady
// after the request was persisted.
func (a *App) autoFence(term *leader.Term, runner *fencing.Runner, req engine.FenceRequest) {
	if a.kube != nil {
		ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
		ok, why := a.kube.needsFencing(ctx, req.Node)
		cancel()
		if !ok {
			a.audit(term, req.Node, "fence-held-back", "automatic fencing not needed: "+why)
			return
		}
		if why != "" {
			req.Evidence = append(req.Evidence, why)
		}
	}
	now := time.Now()
	nc := a.fences().Nodes[req.Node]
	delay := nc.Delay.Duration
	if nc.RandomDelay.Duration > 0 {
		delay += time.Duration(rand.Int64N(int64(nc.RandomDelay.Duration)))
	}
	rec := fencing.NewRecord(api.NewID(req.Node, now), req.Node, coordv1.FenceAction_FENCE_ACTION_OFF,
		func(step string) ([]config.Resolved, error) { return a.fences().Plan(req.Node, step) }, delay, now)
	rec.Reason, rec.RequestedBy, rec.Automatic, rec.Epoch = "node not ready past the fence timeout", "coordinator", true, term.Epoch
	rec.Evidence = append(req.Evidence, rec.Evidence...)
	if !req.KdumpSince.IsZero() {
		// Evidence only: an unauthenticated datagram never confirms a power-off. The record is
		// confirmed by the driver's read-back after power management, which waits for the dump.
		rec.Evidence = append(rec.Evidence, "dumping its memory (fence_kdump, unauthenticated evidence); power management waits for the dump")
	}
	ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
	defer cancel()
	got, _, created, err := a.store.CreateFence(ctx, term, rec)
	if err != nil {
		a.log.Error("automatic fence not started", "node", req.Node, "err", err)
		return
	}
	if created {
		a.log.Warn("automatic fence started", "node", req.Node, "fence", got.Id, "evidence", strings.Join(rec.Evidence, "; "))
		if !req.LastContact.IsZero() {
			a.metrics.ObserveStage("detect", req.NotReadySince.Sub(req.LastContact))
		}
		a.metrics.ObserveStage("decide", req.At.Sub(req.NotReadySince))
	}
	runner.Start(got.Id)
}

// Close stops the server, the drivers' connections, the etcd client and the embedded etcd.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		if a.srv != nil {
			a.srv.Stop()
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

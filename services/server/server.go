// Package server builds the gRPC server every nodefence binary runs: TLS or mutual TLS (plaintext
// only when asked for), keepalive, health and reflection, and one interceptor chain — Prometheus
// metrics, slog logging, domain-error mapping (package fault), a per-method authorization hook and
// panic recovery. Binaries register their services and call Serve; Stop drains with a deadline.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wire"
)

// Authorizer is an extra check after the role policy: it decides whether the caller in ctx (its
// identity is identity.From(ctx)) may call the full gRPC method name, returning an error to refuse
// (PermissionDenied).
type Authorizer func(ctx context.Context, fullMethod string) error

// Config configures a server. The zero value plus SetDefaults is a plaintext-refusing server on
// 127.0.0.1 with an ephemeral port.
type Config struct {
	// Listen is the gRPC listen address (host:port). Port 0 picks a free port.
	Listen string
	// MetricsListen is the Prometheus /metrics HTTP address; empty disables it.
	MetricsListen string
	// MetricsTLS serves MetricsListen over mutual TLS with TLS's certificate and CA; only callers
	// whose certificate identity Policy allows for identity.MetricsEndpoint are answered. Off,
	// metrics are plaintext and meant for loopback (a warning otherwise).
	MetricsTLS bool
	// TLS holds the certificate files; TLS.Insecure allows plaintext.
	TLS tlsfiles.Files
	// MaxConnectionAge bounds a connection's life so load spreads after a failover; streams are cut
	// and clients reconnect. Zero means 30 minutes.
	MaxConnectionAge time.Duration
	// KeepaliveTime is how often an idle connection is pinged. Zero means 20 s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long a ping may go unanswered. Zero means 10 s.
	KeepaliveTimeout time.Duration
	// DrainTimeout bounds GracefulStop before connections are closed hard. Zero means 10 s.
	DrainTimeout time.Duration
	// Policy names the roles that may call each method; nil is identity.Default. Every call but
	// health and reflection needs an identity the policy allows: a verified client certificate's
	// URI SAN, or UnauthenticatedCaller.
	Policy identity.Policy
	// Authorize is an optional extra check after Policy.
	Authorize Authorizer
	// UnauthenticatedCaller is the identity ("any", or a spiffe://nodefence/<role>/<name> URI)
	// granted to callers that present no certificate, which is possible only on a plaintext server
	// or one without a client CA. Empty (the default): such callers reach only health and
	// reflection, every other method answers Unauthenticated. For tests and demos.
	UnauthenticatedCaller string
	// AllowUnauthenticatedClients lets a TLS server start without a client CA (TLS.CAFile): clients
	// then present no certificate and have only UnauthenticatedCaller's identity, if any.
	AllowUnauthenticatedClients bool
	// Pprof serves Go's /debug/pprof handlers on MetricsListen (profiling; off by default).
	Pprof bool
	// BusyStreams names streaming methods ("/package.Service/Method") that carry so many small
	// messages (the agent stream: tens of thousands a second) that observing each one costs more
	// than it tells. Their messages skip the per-message Prometheus and logging hooks; the call is
	// still authorized, recovered, logged when it ends, and counted with its code and duration in
	// nodefence_grpc_busy_stream_handled_total / nodefence_grpc_busy_stream_seconds.
	BusyStreams []string
}

// RegisterFlags binds the server flags shared by every binary.
func (c *Config) RegisterFlags(fs *flag.FlagSet, defaultListen string) {
	c.Listen = defaultListen
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC listen address (host:port)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "Prometheus /metrics listen address (empty: off)")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", c.MaxConnectionAge, "keepalive MaxConnectionAge (0: 30m)")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "graceful stop deadline (0: 10s)")
	fs.BoolVar(&c.MetricsTLS, "metrics-tls", c.MetricsTLS, MetricsTLSFlagHelp)
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve /debug/pprof on --metrics-listen")
	fs.StringVar(&c.UnauthenticatedCaller, "unauthenticated-caller", c.UnauthenticatedCaller,
		`identity granted to callers without a client certificate (--insecure or no --tls-ca): "any" (every role, every node) or spiffe://nodefence/ROLE/NAME; empty: they reach only health and reflection (tests and demos only)`)
	fs.BoolVar(&c.AllowUnauthenticatedClients, "allow-unauthenticated-clients", c.AllowUnauthenticatedClients,
		"allow --tls-cert without --tls-ca (clients present no certificate; see --unauthenticated-caller)")
	c.TLS.RegisterFlags(fs, "", "the gRPC server")
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.MaxConnectionAge == 0 {
		c.MaxConnectionAge = 30 * time.Minute
	}
	if c.KeepaliveTime == 0 {
		c.KeepaliveTime = 20 * time.Second
	}
	if c.KeepaliveTimeout == 0 {
		c.KeepaliveTimeout = 10 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
}

// Validate returns every problem with the configuration.
func (c Config) Validate() []error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen: %q is not host:port", c.Listen))
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen: %q is not host:port", c.MetricsListen))
		}
		if c.MetricsTLS {
			errs = append(errs, ValidateMetricsTLS(c.TLS)...)
		}
	} else if c.Pprof {
		errs = append(errs, errors.New("--pprof: needs --metrics-listen"))
	} else if c.MetricsTLS {
		errs = append(errs, errors.New("--metrics-tls: needs --metrics-listen"))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"max-connection-age", c.MaxConnectionAge}, {"drain-timeout", c.DrainTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("--%s: must not be negative", d.flag))
		}
	}
	if !c.TLS.Insecure && c.TLS.CertFile != "" && c.TLS.CAFile == "" && !c.AllowUnauthenticatedClients {
		errs = append(errs, errors.New("--tls-ca: required to verify client certificates (or --allow-unauthenticated-clients to serve callers without one)"))
	}
	if c.UnauthenticatedCaller != "" {
		if !c.TLS.Insecure && c.TLS.CAFile != "" {
			errs = append(errs, errors.New("--unauthenticated-caller: has no effect with --tls-ca (every client presents a certificate)"))
		}
		if _, err := anonymous(c.UnauthenticatedCaller); err != nil {
			errs = append(errs, fmt.Errorf("--unauthenticated-caller: %w", err))
		}
	}
	return append(errs, c.TLS.Validate("", true)...)
}

// anonymous parses UnauthenticatedCaller.
func anonymous(s string) (*identity.Identity, error) {
	switch s {
	case "":
		return nil, nil
	case "any":
		return &identity.Identity{Role: identity.Any}, nil
	}
	id, err := identity.Parse(s)
	if err != nil {
		return nil, err
	}
	return &id, nil
}

// loopback reports whether a listen address's host is a loopback address or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Server is a configured gRPC server with health, reflection and metrics.
type Server struct {
	// GRPC is the server to register services on before Serve.
	GRPC *grpc.Server
	// Health is the health service; binaries set per-service status on it.
	Health *health.Server
	// Registry is the Prometheus registry served on MetricsListen; binaries add their collectors.
	Registry *prometheus.Registry
	// Certs reports the expiry of the server's certificate (role serving) in Registry; binaries
	// add the reloaders of the certificates they dial with.
	Certs *tlsfiles.Metrics

	cfg     Config
	certs   *tlsfiles.Reloader // nil when plaintext
	log     *slog.Logger
	lis     net.Listener
	metrics *grpcprom.ServerMetrics
	httpSrv *http.Server
	httpLis net.Listener
}

// New validates cfg, binds the listeners and builds the server. Nothing is served until Serve.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	certs, err := cfg.TLS.Watch(log, "the server's certificate")
	if err != nil {
		return nil, err
	}
	var tlsCfg *tls.Config
	if certs != nil {
		tlsCfg = certs.ServerConfig("h2")
	}
	reg := prometheus.NewRegistry()
	certMetrics := tlsfiles.NewMetrics()
	certMetrics.Add(tlsfiles.RoleServing, certs)
	reg.MustRegister(certMetrics)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0005, .001, .005, .01, .05, .1, .5, 1, 5, 30}),
	))
	reg.MustRegister(metrics)

	policy := cfg.Policy
	if policy == nil {
		policy = identity.Default
	}
	anon, _ := anonymous(cfg.UnauthenticatedCaller) // validated
	if anon != nil {
		log.Warn("callers without a client certificate are trusted", "identity", anon.String())
	}
	authFn := authorizer(cfg, policy, anon)
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		log.Log(ctx, slog.Level(lvl), msg, fields...)
	})

	busy := map[string]bool{}
	for _, m := range cfg.BusyStreams {
		busy[m] = true
	}
	notBusy := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool { return !busy[c.FullMethod()] })
	busyStreams := newBusyStreams(busy, logger)
	reg.MustRegister(busyStreams.handled, busyStreams.seconds)

	opts := serverOptions(cfg, log, logger, metrics, authFn, notBusy, busyStreams, tlsCfg)
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	s := &Server{
		GRPC:     grpc.NewServer(opts...),
		Health:   health.NewServer(),
		Registry: reg,
		Certs:    certMetrics,
		certs:    certs,
		cfg:      cfg,
		log:      log,
		lis:      lis,
		metrics:  metrics,
	}
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	reflection.Register(s.GRPC)
	if cfg.MetricsListen != "" {
		if err := s.listenMetrics(policy); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// authorizer is the server's authentication and authorization: open methods pass; every other call
// needs a certificate identity (or anon, if set) that policy and cfg.Authorize allow for the method.
func authorizer(cfg Config, policy identity.Policy, anon *identity.Identity) auth.AuthFunc {
	return func(ctx context.Context) (context.Context, error) {
		method, _ := grpc.Method(ctx)
		if identity.Open(method) {
			return ctx, nil
		}
		id, err := identity.FromPeer(ctx)
		if errors.Is(err, identity.ErrNoIdentity) && anon != nil {
			id, err = *anon, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", fault.ErrCallerUnauthenticated, err)
		}
		if err := policy.Allow(id, method); err != nil {
			return nil, fmt.Errorf("%w: %v", fault.ErrPermissionDenied, err)
		}
		ctx = identity.With(ctx, id)
		if cfg.Authorize != nil {
			if err := cfg.Authorize(ctx, method); err != nil {
				if !errors.Is(err, fault.ErrPermissionDenied) {
					err = fmt.Errorf("%w: %v", fault.ErrPermissionDenied, err)
				}
				return nil, err
			}
		}
		return ctx, nil
	}
}

// serverOptions are the gRPC server's options: flow-control windows, codec, keepalives, TLS (if
// tlsCfg is set) and the interceptor chains (metrics and logging skip the notBusy streams, which
// busyStreams counts and logs itself).
func serverOptions(cfg Config, log *slog.Logger, logger logging.Logger, metrics *grpcprom.ServerMetrics, authFn auth.AuthFunc,
	notBusy selector.Matcher, busyStreams *busyStreams, tlsCfg *tls.Config) []grpc.ServerOption {
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		log.Error("panic in handler", "method", method, "panic", fmt.Sprint(p))
		return status.Error(codes.Internal, "internal error (see the server log)")
	})
	opts := []grpc.ServerOption{
		grpc.InitialWindowSize(wire.StreamWindow), grpc.InitialConnWindowSize(wire.ConnWindow),
		// The protobuf codec, which also lets a busy stream receive *wire.Encoded and decode it itself.
		grpc.ForceServerCodecV2(wire.Codec()),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.DrainTimeout,
			Time:                  cfg.KeepaliveTime,
			Timeout:               cfg.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(
			metrics.UnaryServerInterceptor(),
			logging.UnaryServerInterceptor(logger, logOpts...),
			fault.UnaryServerInterceptor(log),
			auth.UnaryServerInterceptor(authFn),
			recovery.UnaryServerInterceptor(recoverOpt),
		),
		grpc.ChainStreamInterceptor(
			selector.StreamServerInterceptor(metrics.StreamServerInterceptor(), notBusy),
			selector.StreamServerInterceptor(logging.StreamServerInterceptor(logger, logOpts...), notBusy),
			busyStreams.interceptor,
			fault.StreamServerInterceptor(log),
			auth.StreamServerInterceptor(authFn),
			recovery.StreamServerInterceptor(recoverOpt),
		),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	return opts
}

// listenMetrics binds the metrics listener and builds its HTTP server (metrics, and pprof if
// configured), with TLS and policy's authorization under cfg.MetricsTLS. On an error it closes the
// gRPC listener.
func (s *Server) listenMetrics(policy identity.Policy) error {
	cfg, log, reg, lis := s.cfg, s.log, s.Registry, s.lis
	var err error
	if !cfg.MetricsTLS && !loopback(cfg.MetricsListen) {
		log.Warn("metrics are served without TLS or authentication on a non-loopback address (see --metrics-tls)", "addr", cfg.MetricsListen, "pprof", cfg.Pprof)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	var handler http.Handler = mux
	var metricsTLS *tls.Config
	if cfg.MetricsTLS {
		var authorize func(http.Handler) http.Handler
		if metricsTLS, authorize, err = secureMetrics(s.certs, cfg.TLS, policy, log); err != nil {
			lis.Close()
			return fmt.Errorf("--metrics-tls: %w", err)
		}
		handler = authorize(mux)
	}
	s.httpLis, err = net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		lis.Close()
		return fmt.Errorf("--metrics-listen %s: %w", cfg.MetricsListen, err)
	}
	if metricsTLS != nil {
		s.httpLis = tls.NewListener(s.httpLis, metricsTLS)
	}
	s.httpSrv = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	return nil
}

// Addr is the bound gRPC address (useful with port 0).
func (s *Server) Addr() string { return s.lis.Addr().String() }

// MetricsAddr is the bound metrics address, or "" when metrics are off.
func (s *Server) MetricsAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// Serve serves until Stop. Register every service before calling it.
func (s *Server) Serve() error {
	s.metrics.InitializeMetrics(s.GRPC)
	if s.httpSrv != nil {
		go func() {
			if err := s.httpSrv.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("metrics server stopped", "err", err)
			}
		}()
	}
	s.log.Info("serving gRPC", "addr", s.Addr(), "tls", !s.cfg.TLS.Insecure, "mutual_tls", !s.cfg.TLS.Insecure && s.cfg.TLS.CAFile != "")
	return s.GRPC.Serve(s.lis)
}

// Stop marks the server not serving, drains in-flight calls for at most DrainTimeout, then closes
// every connection.
func (s *Server) Stop() {
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		s.log.Warn("drain deadline passed, closing connections", "deadline", s.cfg.DrainTimeout)
		s.GRPC.Stop()
		<-done
	}
	if s.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.httpSrv.Shutdown(ctx)
	}
}

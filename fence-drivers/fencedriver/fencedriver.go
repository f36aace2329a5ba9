// Package fencedriver is the fence-driver program (its main is cmd/fence-driver): its flags, parsed
// into Config, and Main, which runs it. The fence-driver serves nodefence.driver.v1.FenceDriverService for one fence driver:
//
//	fence-driver --driver ipmi --listen 127.0.0.1:7101 --state-dir /var/lib/nodefence/driver \
//	    --tls-cert server.pem --tls-key server-key.pem --tls-ca ca.pem
//
// The state directory keeps the highest epoch seen per device, so a restarted driver still
// refuses a deposed coordinator. Invalid flags are all reported at once and exit with status 2.
package fencedriver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodefence/nodefence/fence-drivers/aws"
	"github.com/nodefence/nodefence/fence-drivers/brocade"
	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/pdu"
	"github.com/nodefence/nodefence/fence-drivers/redfish"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/buildinfo"
	"github.com/nodefence/nodefence/services/server"
)

// drivers are the drivers this binary can serve, by --driver name.
var drivers = map[string]func(c *Config, log *slog.Logger) kit.Driver{
	"agent": func(c *Config, _ *slog.Logger) kit.Driver {
		return fenceagent.NewWith(fenceagent.Config{ExtraParameters: c.AgentExtraParameters})
	},
	"ipmi": func(*Config, *slog.Logger) kit.Driver { return ipmi.New() },
	"pdu":  func(*Config, *slog.Logger) kit.Driver { return pdu.New() },
	"brocade": func(c *Config, log *slog.Logger) kit.Driver {
		return brocade.NewWith(brocade.Config{KnownHostsFile: c.knownHosts(), Log: log})
	},
	"redfish": func(*Config, *slog.Logger) kit.Driver { return redfish.New() },
	"aws":     func(*Config, *slog.Logger) kit.Driver { return aws.New() },
}

// Config is everything the binary is configured with.
type Config struct {
	// Driver names the driver to serve (a key of drivers).
	Driver string
	// StateDir holds the persisted epochs.
	StateDir string
	// DefaultTimeout bounds operations whose request has no timeout.
	DefaultTimeout time.Duration
	// PollInterval is the pause between read-backs while verifying an action.
	PollInterval time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// KnownHosts is the SSH known_hosts file of SSH drivers (brocade) for targets that pin no
	// host key: unknown keys are recorded on first use, changed keys refused. Default
	// <state-dir>/known_hosts.
	KnownHosts string
	// AgentExtraParameters are fence-agent parameters allowed beyond the agent driver's built-in
	// allowlist (--driver agent); parameters naming programs, scripts or files stay refused.
	AgentExtraParameters []string
	// Server is the gRPC server configuration (listen address, TLS, metrics).
	Server server.Config
}

func (c *Config) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Driver, "driver", "", "fence driver to serve: "+strings.Join(driverNames(), "|"))
	fs.StringVar(&c.StateDir, "state-dir", "", "directory for persisted epochs and recent operation answers (required)")
	fs.DurationVar(&c.DefaultTimeout, "default-timeout", 20*time.Second, "operation timeout when a request has none")
	fs.DurationVar(&c.PollInterval, "poll-interval", 100*time.Millisecond, "pause between status read-backs")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.KnownHosts, "ssh-known-hosts", "", "SSH known_hosts file for targets that pin no host key (accept-new; default <state-dir>/known_hosts)")
	fs.Func("agent-allow-parameter", "fence-agent parameter to allow beyond the built-in allowlist (--driver agent; repeatable)", func(v string) error {
		c.AgentExtraParameters = append(c.AgentExtraParameters, kit.NormalizeName(v))
		return nil
	})
	c.Server.RegisterFlags(fs, "127.0.0.1:7101")
}

// validate returns every problem with the configuration.
func (c *Config) validate(args []string) []error {
	var errs []error
	if len(args) > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", args))
	}
	switch {
	case c.Driver == "":
		errs = append(errs, fmt.Errorf("--driver: required (one of %s)", strings.Join(driverNames(), ", ")))
	case drivers[c.Driver] == nil:
		errs = append(errs, fmt.Errorf("--driver: unknown driver %q (known: %s)", c.Driver, strings.Join(driverNames(), ", ")))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir: required (epochs must survive restarts)"))
	} else if fi, err := os.Stat(c.StateDir); err == nil && !fi.IsDir() {
		errs = append(errs, fmt.Errorf("--state-dir: %s is not a directory", c.StateDir))
	}
	if c.DefaultTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--default-timeout: must be positive, got %s", c.DefaultTimeout))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("--poll-interval: must be positive, got %s", c.PollInterval))
	} else if c.DefaultTimeout > 0 && c.PollInterval >= c.DefaultTimeout {
		errs = append(errs, fmt.Errorf("--poll-interval: %s must be shorter than --default-timeout %s", c.PollInterval, c.DefaultTimeout))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %q is not debug, info, warn or error", c.LogLevel))
	}
	srv := c.Server
	srv.SetDefaults()
	return append(errs, srv.Validate()...)
}

// knownHosts is the known_hosts file SSH drivers use by default.
func (c *Config) knownHosts() string {
	if c.KnownHosts != "" {
		return c.KnownHosts
	}
	return filepath.Join(c.StateDir, "known_hosts")
}

func driverNames() []string { return slices.Sorted(maps.Keys(drivers)) }

// Main is the whole program: it parses args, serves until ctx ends and returns the exit status (2
// for invalid flags, 1 for a failure to start or serve).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fence-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	cfg.registerFlags(fs)
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.String("fence-driver"))
		return 0
	}
	if errs := cfg.validate(fs.Args()); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(stderr, "fence-driver: %v\n", err)
		}
		return 2
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("driver", cfg.Driver)

	srv, err := server.New(cfg.Server, log)
	if err != nil {
		log.Error("cannot start the gRPC server", "err", err)
		return 1
	}
	d := drivers[cfg.Driver](&cfg, log)
	if c, ok := d.(interface{ Close() }); ok {
		defer c.Close() // log out of the sessions kept for reuse
	}
	svc, err := kit.NewService(d, kit.Options{
		StateDir: cfg.StateDir, DefaultTimeout: cfg.DefaultTimeout, PollInterval: cfg.PollInterval, Log: log,
		Metrics: kit.NewMetrics(srv.Registry),
	})
	if err != nil {
		srv.Stop()
		log.Error("cannot start the driver service", "err", err)
		return 1
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	srv.Health.SetServingStatus(kit.ServiceName, healthpb.HealthCheckResponse_SERVING)
	srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	fmt.Fprintf(stdout, "fence-driver %s serving on %s\n", cfg.Driver, srv.Addr())

	select {
	case <-ctx.Done():
		log.Info("stopping")
		srv.Stop()
		<-served
		return 0
	case err := <-served:
		log.Error("gRPC server stopped", "err", err)
		return 1
	}
}

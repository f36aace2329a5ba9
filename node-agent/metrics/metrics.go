// Package metrics is the node agent's Prometheus endpoint: the eviction signals, the pressure
// conditions, the state of the coordinator stream and kubelet's graceful shutdown metrics.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Stream is what the metrics read from the agent's coordinator stream; agent.Agent is one.
type Stream interface {
	Connected() bool
	Unacked() int
}

// certSource is a stream whose TLS material is reloaded (agent.Agent is one): its certificate's
// expiry is exported as nodefence_certificate_expiry_seconds{role="client"}.
type certSource interface {
	Certs() *tlsfiles.Reloader
}

// Metrics are the agent's metrics. A nil *Metrics records nothing, so that callers need no checks.
type Metrics struct {
	// Registry holds every metric below plus the Go and process collectors.
	Registry *prometheus.Registry

	signalAvailable *prometheus.GaugeVec
	signalCapacity  *prometheus.GaugeVec
	condition       *prometheus.GaugeVec
	shutdownStart   prometheus.Gauge
	shutdownEnd     prometheus.Gauge
	evictions       *prometheus.CounterVec
}

// New registers the agent's metrics in a new registry; stream may be nil (no stream metrics).
func New(stream Stream) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		signalAvailable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "nodefence_agent", Name: "signal_available",
			Help: "Latest value of each eviction signal: bytes, inodes or pids available (kubelet's definition).",
		}, []string{"signal"}),
		signalCapacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "nodefence_agent", Name: "signal_capacity",
			Help: "Capacity each eviction signal is measured against (percentage thresholds resolve against it).",
		}, []string{"signal"}),
		condition: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "nodefence_agent", Name: "node_condition",
			Help: "1 while the pressure condition (MemoryPressure, DiskPressure, PIDPressure) is true, else 0.",
		}, []string{"condition"}),
		shutdownStart: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "graceful_shutdown_start_time_seconds",
			Help: "Unix time the last graceful node shutdown started (kubelet's metric).",
		}),
		shutdownEnd: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "graceful_shutdown_end_time_seconds",
			Help: "Unix time the last graceful node shutdown finished terminating pods (kubelet's metric).",
		}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nodefence_agent", Name: "evictions_total",
			Help: "Pod evictions by signal and kind: EVICTION_KIND_HARD (local, at once), _FALLBACK (local, no grant in time), _GRANTED (paced by the coordinator), _FAILED and _DECLINED grants.",
		}, []string{"signal", "kind"}),
	}
	reg.MustRegister(m.signalAvailable, m.signalCapacity, m.condition, m.shutdownStart, m.shutdownEnd, m.evictions,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cs, ok := stream.(certSource); ok && cs.Certs() != nil {
		certs := tlsfiles.NewMetrics()
		certs.Add(tlsfiles.RoleClient, cs.Certs())
		reg.MustRegister(certs)
	}
	if stream != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "nodefence_agent", Name: "stream_connected",
				Help: "1 while the stream to the coordinator leader is up.",
			}, func() float64 {
				if stream.Connected() {
					return 1
				}
				return 0
			}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "nodefence_agent", Name: "unacked_messages",
				Help: "Messages sent or queued for the coordinator and not yet acknowledged.",
			}, func() float64 { return float64(stream.Unacked()) }),
		)
	}
	return m
}

// Signal records a signal's latest value.
func (m *Metrics) Signal(name string, available, capacity int64) {
	if m == nil {
		return
	}
	m.signalAvailable.WithLabelValues(name).Set(float64(available))
	m.signalCapacity.WithLabelValues(name).Set(float64(capacity))
}

// Condition records a condition's status.
func (m *Metrics) Condition(name string, pressure bool) {
	if m == nil {
		return
	}
	v := 0.0
	if pressure {
		v = 1
	}
	m.condition.WithLabelValues(name).Set(v)
}

// Eviction counts one eviction (or grant outcome) of kind for signal.
func (m *Metrics) Eviction(signal, kind string) {
	if m != nil {
		m.evictions.WithLabelValues(signal, kind).Inc()
	}
}

// ShutdownStarted sets graceful_shutdown_start_time_seconds.
func (m *Metrics) ShutdownStarted(at time.Time) {
	if m != nil {
		m.shutdownStart.Set(float64(at.UnixNano()) / 1e9)
	}
}

// ShutdownEnded sets graceful_shutdown_end_time_seconds.
func (m *Metrics) ShutdownEnded(at time.Time) {
	if m != nil {
		m.shutdownEnd.Set(float64(at.UnixNano()) / 1e9)
	}
}

// Serve serves /metrics on lis until ctx is done; authorize, when not nil, wraps the handler (the
// caller check of a mutual-TLS listener, server.SecureMetrics).
func (m *Metrics) Serve(ctx context.Context, lis net.Listener, authorize func(http.Handler) http.Handler, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	var h http.Handler = mux
	if authorize != nil {
		h = authorize(mux)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving metrics", "address", lis.Addr().String())
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

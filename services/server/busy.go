package server

import (
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// busyStreams observes the calls of Config.BusyStreams as a whole: one log line and one count when
// a call ends, nothing per message.
type busyStreams struct {
	methods map[string]bool
	log     logging.Logger
	handled *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newBusyStreams(methods map[string]bool, log logging.Logger) *busyStreams {
	labels := []string{"grpc_service", "grpc_method", "grpc_code"}
	return &busyStreams{
		methods: methods,
		log:     log,
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodefence_grpc_busy_stream_handled_total",
			Help: "Calls of busy streaming methods (messages not observed one by one) completed, by code.",
		}, labels),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodefence_grpc_busy_stream_seconds",
			Help:    "How long calls of busy streaming methods lasted.",
			Buckets: []float64{1, 10, 60, 600, 3600, 6 * 3600, 24 * 3600},
		}, labels),
	}
}

func (b *busyStreams) interceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !b.methods[info.FullMethod] {
		return h(srv, ss)
	}
	start := time.Now()
	err := h(srv, ss)
	elapsed := time.Since(start)
	code := status.Code(err)
	c := interceptors.NewServerCallMeta(info.FullMethod, info, nil)
	b.handled.WithLabelValues(c.Service, c.Method, code.String()).Inc()
	b.seconds.WithLabelValues(c.Service, c.Method, code.String()).Observe(elapsed.Seconds())
	fields := []any{"protocol", "grpc", "grpc.component", "server", "grpc.service", c.Service, "grpc.method", c.Method,
		"grpc.method_type", string(c.Typ), "grpc.code", code.String(), "grpc.time_ms", float64(elapsed.Microseconds()) / 1000}
	if p, ok := peer.FromContext(ss.Context()); ok {
		fields = append(fields, "peer.address", p.Addr.String())
	}
	if err != nil {
		fields = append(fields, "grpc.error", err.Error())
	}
	b.log.Log(ss.Context(), logging.DefaultServerCodeToLevel(code), "finished call", fields...)
	return err
}

package kit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are a driver service's Prometheus collectors, per device (the device key the kit
// serializes operations on: never a secret). Operators alert on them: a device whose checks fail
// cannot fence its node when it must.
type Metrics struct {
	// Operations counts every operation on a device by action (off, on, reboot, status, monitor)
	// and its gRPC code (OK when confirmed).
	Operations *prometheus.CounterVec
	// Seconds is each operation's duration, read-backs included.
	Seconds *prometheus.HistogramVec
	// DeviceUp is 1 after a device answered a status or monitor call with its credentials
	// accepted, 0 after one failed; absent for a device never checked.
	DeviceUp *prometheus.GaugeVec
}

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Operations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_driver_operations_total",
			Help: "Fence-driver operations by driver, device, action and gRPC code."}, []string{"driver", "device", "action", "code"}),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nodefence_driver_operation_seconds",
			Help:    "Duration of fence-driver operations, read-back included, by driver, device and action.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}}, []string{"driver", "device", "action"}),
		DeviceUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_driver_device_up",
			Help: "1 when the device's last status or monitor call succeeded with its credentials accepted, else 0."}, []string{"driver", "device"}),
	}
	reg.MustRegister(m.Operations, m.Seconds, m.DeviceUp)
	return m
}

// observe records one operation; up is nil for an operation that says nothing about the device's
// health (a mutation, whose read-back may legitimately time out on a dying node).
func (m *Metrics) observe(driver, device, action string, code codes.Code, elapsed time.Duration, up *bool) {
	if m == nil || device == "" {
		return
	}
	m.Operations.WithLabelValues(driver, device, action, code.String()).Inc()
	m.Seconds.WithLabelValues(driver, device, action).Observe(elapsed.Seconds())
	if up != nil {
		v := 0.0
		if *up {
			v = 1
		}
		m.DeviceUp.WithLabelValues(driver, device).Set(v)
	}
}

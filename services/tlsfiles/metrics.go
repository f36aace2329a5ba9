package tlsfiles

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric roles of the reloaders a component registers with Metrics.Add. A certificate's role says
// what it is used for; its CA bundle is reported as role + "-ca".
const (
	// RoleServing is the certificate a component's gRPC and metrics servers present.
	RoleServing = "serving"
	// RoleClient is the certificate a component presents when it dials another nodefence component
	// (the coordinator to drivers, an agent to the coordinator).
	RoleClient = "client"
	// RoleEtcdClient is the certificate the coordinator presents to an external etcd.
	RoleEtcdClient = "etcd-client"
)

var (
	expiryDesc = prometheus.NewDesc("nodefence_certificate_expiry_seconds",
		"Seconds until the loaded certificate expires (NotAfter - now; negative once expired), by role: serving, client, etcd-client for a component's own certificate, and <role>-ca for the latest-expiring CA of the bundle it verifies peers with. It follows the files as they are reloaded.",
		[]string{"role"}, nil)
	failuresDesc = prometheus.NewDesc("nodefence_certificate_reload_failures_total",
		"Changed certificate, key or CA files that did not load (half written, key and certificate not matching, no certificate in a bundle): the previous material stays in use. Each change counts once.",
		[]string{"role"}, nil)
)

// Metrics exports nodefence_certificate_expiry_seconds and
// nodefence_certificate_reload_failures_total for the reloaders added to it. A scrape asks every
// reloader, which reads its files first when a check is due, so the expiry follows a renewal
// even before the next handshake.
type Metrics struct {
	// Now is the clock the expiry is measured against; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	roles map[string]*Reloader
}

// NewMetrics returns an empty collector; register it once, Add reloaders any time.
func NewMetrics() *Metrics { return &Metrics{roles: map[string]*Reloader{}} }

// Add reports r under role (nil r is ignored; a second reloader for a role replaces the first).
func (m *Metrics) Add(role string, r *Reloader) {
	if r == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roles[role] = r
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- expiryDesc
	ch <- failuresDesc
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	roles := make([]string, 0, len(m.roles))
	for role := range m.roles {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	rs := make([]*Reloader, len(roles))
	for i, role := range roles {
		rs[i] = m.roles[role]
	}
	m.mu.Unlock()
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	t := now()
	for i, role := range roles {
		cert, ca := rs[i].Expiry()
		if !cert.IsZero() {
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, cert.Sub(t).Seconds(), role)
		}
		if !ca.IsZero() {
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, ca.Sub(t).Seconds(), role+"-ca")
		}
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(rs[i].Failures()), role)
	}
}

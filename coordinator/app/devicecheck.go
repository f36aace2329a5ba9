package app

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
)

// deviceChecks is the leader's periodic, non-destructive check of every fence method: the
// driver's Monitor (device reachable, credentials accepted), so that a BMC that stopped answering
// or a password that was changed raises an alert before the node it fences dies, not after.
type deviceChecks struct {
	ok *prometheus.GaugeVec
}

func newDeviceChecks(reg prometheus.Registerer) *deviceChecks {
	d := &deviceChecks{ok: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_fence_device_check_ok",
		Help: "1 when the last check of a node's fence method found its device reachable with the credentials accepted, else 0."},
		[]string{"node", "method", "driver"})}
	reg.MustRegister(d.ok)
	return d
}

// checkAll checks every configured method: one pass of the term's device-checks job, which runs
// every Config.DeviceCheckInterval. The term's end resets the gauges (termParts.stop): a follower
// reports nothing, the next leader checks.
func (d *deviceChecks) checkAll(ctx context.Context, a *App, secrets fenceconfig.SecretReader) {
	cfg := a.fences()
	if cfg == nil {
		return
	}
	d.ok.Reset()
	eachMethod(cfg, func(node string, m fenceconfig.Resolved) {
		if ctx.Err() != nil {
			return
		}
		v := 0.0
		if d.check(ctx, a, secrets, node, m) {
			v = 1
		}
		d.ok.WithLabelValues(node, m.Name, m.Driver).Set(v)
	})
}

// eachMethod calls f once for every fence method of every configured node, in the order of the
// node's steps.
func eachMethod(cfg *fenceconfig.Config, f func(node string, m fenceconfig.Resolved)) {
	for _, node := range cfg.NodeNames() {
		seen := map[string]bool{}
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			methods, err := cfg.Plan(node, step)
			if err != nil {
				continue
			}
			for _, m := range methods {
				if !seen[m.Name] {
					seen[m.Name] = true
					f(node, m)
				}
			}
		}
	}
}

// warmSecrets reads every Secret a fence method refers to, so that their values are at hand if the
// apiserver goes away before the first fence (kubeMode.secret keeps the last value read).
func warmSecrets(cfg *fenceconfig.Config, secrets fenceconfig.SecretReader) {
	if cfg == nil || secrets == nil {
		return
	}
	eachMethod(cfg, func(_ string, m fenceconfig.Resolved) { _, _ = fenceconfig.ResolveSecrets(m.Parameters, secrets) })
}

func (d *deviceChecks) check(ctx context.Context, a *App, secrets fenceconfig.SecretReader, node string, m fenceconfig.Resolved) bool {
	r := a.probe(ctx, secrets, node, m, false)
	if !r.Reachable || !r.CredentialsOk {
		a.log.Warn("fence device check failed", "node", node, "method", m.Name, "driver", m.Driver,
			"reachable", r.Reachable, "credentials_ok", r.CredentialsOk, "detail", r.Detail)
		return false
	}
	return true
}

package app

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
)

// storeGuard keeps the store serving fences when one identity tries to spend it: the audit trail
// is written apart from everything else and given up first (store.AuditWriter), pruned at the rate
// it can grow (store.AuditPruneEvery), and a leader etcd refuses writes to resigns and raises an
// alarm (leader.Elector.OnUnwritable) instead of holding its lease while serving nobody.
type storeGuard struct {
	auditDropped *prometheus.CounterVec
	unwritable   *prometheus.CounterVec
	alarm        prometheus.Gauge

	mu    sync.Mutex
	term  *leader.Term // the term whose audit writer audit uses
	write *store.AuditWriter
}

func newStoreGuard(reg prometheus.Registerer) *storeGuard {
	g := &storeGuard{
		auditDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_audit_entries_dropped_total",
			Help: "Audit entries the leader dropped instead of writing, by reason (queue-full: more than the trail may grow by; write-failed: etcd refused the batch)."},
			[]string{"reason"}),
		unwritable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_leader_unwritable_total",
			Help: "Terms this replica ended because etcd refused the leader's writes, by reason (nospace, corrupt, writes-failing)."},
			[]string{"reason"}),
		alarm: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nodefence_store_unwritable",
			Help: "1 while etcd refuses this replica's writes (its last term ended for it, or a campaign was refused for lack of space); 0 once it leads again. No replica can fence meanwhile."}),
	}
	for _, r := range []string{"queue-full", "write-failed"} {
		g.auditDropped.WithLabelValues(r)
	}
	for _, r := range []string{leader.UnwritableNoSpace, leader.UnwritableCorrupt, leader.UnwritableFailing} {
		g.unwritable.WithLabelValues(r)
	}
	reg.MustRegister(g.auditDropped, g.unwritable, g.alarm)
	return g
}

// onUnwritable is the elector's alarm: a term ended because etcd refuses its writes.
func (g *storeGuard) onUnwritable(reason string) {
	g.unwritable.WithLabelValues(reason).Inc()
	g.alarm.Set(1)
}

// campaignFailed raises the alarm when a campaign failed because etcd is out of space.
func (g *storeGuard) campaignFailed(err error) {
	if leader.NoSpace(err) {
		g.alarm.Set(1)
	}
}

// startTerm gives term its audit writer and clears the alarm: the replica leads, so etcd took
// its campaign's writes.
func (g *storeGuard) startTerm(a *App, term *leader.Term) *store.AuditWriter {
	w := a.store.NewAuditWriter(term, store.AuditLimits{})
	w.Log = a.log
	w.OnDrop = func(reason string, n int) { g.auditDropped.WithLabelValues(reason).Add(float64(n)) }
	g.mu.Lock()
	g.term, g.write = term, w
	g.mu.Unlock()
	g.alarm.Set(0)
	return w
}

// writer returns term's audit writer, or nil once another term has one.
func (g *storeGuard) writer(term *leader.Term) *store.AuditWriter {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.term != term {
		return nil
	}
	return g.write
}

// pruneAudit keeps the audit trail within the retention at the rate it can grow: one pass of the
// term's prune-audit job, which runs every store.AuditPruneEvery when the audit trail has a
// retention (pruneHistory prunes the fence history, less often).
func (a *App) pruneAudit(ctx context.Context, term *leader.Term) {
	pctx, cancel := context.WithTimeout(ctx, pruneTimeout)
	n, err := a.store.PruneAudit(pctx, term, a.now(), a.cfg.Retention)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		a.log.Warn("pruning the audit trail failed; retrying at the next pass", "err", err)
	case n > 0:
		a.log.Info("pruned the audit trail", "audit_entries", n)
	}
}

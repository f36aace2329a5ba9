package loop

import "github.com/nodefence/nodefence/coordinator/engine"

// audit logs a persisted batch's events and hands them to the audit trail (Config.Audit), and
// counts the agent events the engine's per-node limits held back or dropped. Audit entries are
// never written with the engine's state: a store short of space or slow refuses or delays the
// audit first, never the state or a fence record.
func (l *Loop) audit(rd engine.Ready) {
	for _, ev := range rd.Events {
		l.cfg.Log.Info(ev.Text, "component", "engine")
		if l.cfg.Audit != nil {
			l.cfg.Audit(ev)
		}
	}
	if m := l.cfg.Metrics; m != nil && m.AgentEventsDropped != nil {
		for _, d := range rd.Dropped {
			m.AgentEventsDropped.WithLabelValues(d.Kind).Inc()
		}
	}
}

package app

import (
	"context"
	"fmt"
	"net"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/job"
	"github.com/nodefence/nodefence/services/wdlease"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

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
	// Nothing is served before etcd is known to admit only the coordinators.
	if err := a.checkEtcdLocked(ctx); err != nil {
		a.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	serveErr := make(chan error, 1)
	defer a.stopProcess()
	a.startProcess(ctx, serveErr)
	a.srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
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
			a.storeG.campaignFailed(err)
			select {
			case <-a.clock().After(campaignRetry):
			case <-ctx.Done():
			}
			continue
		}
		t := a.lead(term)
		select {
		case <-term.Context().Done():
			a.log.Warn("leadership term ended", "epoch", term.Epoch)
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), resignTimeout)
			_ = term.Resign(rctx)
			cancel()
		}
		a.mu.Lock()
		a.leading = nil
		a.mu.Unlock()
		t.stop()
		a.fenceMx.reset()
	}
	return nil
}

// reachable checks that this replica's advertised address accepts connections before it campaigns:
// other replicas remove the election key of a leader whose address refuses them.
func (a *App) reachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", a.advertise)
	if err != nil {
		return fmt.Errorf("--advertise %s does not accept connections, not campaigning: %w", a.advertise, err)
	}
	return c.Close()
}

// lead builds one term's parts and starts them.
func (a *App) lead(term *leader.Term) *termParts {
	t := a.newTerm(term)
	t.start()
	return t
}

// termParts is what one leadership term runs: an engine loop (every node gets a fresh grace
// period; persisted state is restored) and a fence runner that resumes every active record, with
// the device checks, the history's index and pruning, and in Kubernetes mode the mirror's term.
// newTerm builds every part before start runs any of them: the loop's OnReady starts automatic
// fences on the runner, and the runner's Facts query the loop, so neither may run before the other
// exists.
type termParts struct {
	a       *App
	term    *leader.Term
	loop    *loop.Loop
	runner  *fencing.Runner
	secrets fenceconfig.SecretReader // nil in standalone mode
	audit   *store.AuditWriter       // the term's audit trail, written apart from its state
	leases  *api.Leases              // the term's watchdog leases
	// writer is the one writer of the records and audit entries the term's core decides.
	writer *recordWriter
	// jobs owns every goroutine of the term (jobs.go): the term's end stops them and waits for
	// them before the next term starts.
	jobs *job.Group
}

// newTerm builds a term's parts; nothing runs until start.
func (a *App) newTerm(term *leader.Term) *termParts {
	t := &termParts{a: a, term: term, audit: a.storeG.startTerm(a, term)}
	t.jobs = job.NewGroup(termGroup(term.Epoch), job.Options{Clock: a.clock(), Report: t.report})
	if a.kube != nil {
		t.secrets = a.kube.secret
	}
	var initial []engine.Input
	now := a.now()
	for _, n := range a.fences().NodeNames() {
		nc := a.fences().Nodes[n]
		initial = append(initial, engine.Configured{Node: n, Region: nc.Region, Zone: nc.Zone, Fenceable: true, At: now})
	}
	ec := a.cfg.Engine
	ec.AgentHeartbeat = a.cfg.AgentHeartbeatInterval // the proof's cadence of the agent witness
	t.loop = loop.New(loop.Config{
		Engine: ec, Term: term, Store: a.store,
		Initial: initial, Metrics: a.metrics, Log: a.log, Now: a.now, After: a.cfg.After,
		Audit:   func(ev engine.Event) { t.audit.Append(ev.At, ev.Node, ev.Kind, ev.Text) },
		OnReady: t.onReady,
	})
	t.runner = &fencing.Runner{Store: a.store, Secrets: t.secrets, Term: term, Config: a.fences, Drivers: a.drivers,
		OpTimeout: a.cfg.FenceOpTimeout, Policy: a.cfg.Fencing, Now: a.now, After: a.cfg.After, Log: a.log,
		OnChange: t.fenceChanged, Facts: t.facts, Contact: t.contact, Jobs: t.jobs}
	t.leases = a.leases(term)
	t.writer = newRecordWriter(t)
	t.runner.SelfFence = selfFence{t: t, leases: t.leases}
	return t
}

// onReady passes the engine's decisions on: automatic fences to the runner, the rest to the
// Kubernetes mirror. It runs on the loop goroutine.
func (t *termParts) onReady(rd engine.Ready) {
	t.writer.fences(rd.Fences) // an observed request is recorded as would fence, never run
	t.a.proof.verdicts(rd.Proofs)
	t.writer.verdicts(rd.Proofs)
	if t.a.kube != nil {
		t.a.kube.onReady(rd)
	}
}

// fenceChanged follows a fence record's change: the Kubernetes mirror and the audit hear of it,
// the engine keeps it as the node's newest record (its proof, the hold on automatic fences), and a
// confirmed power-off reaches the engine's view of the node at once.
func (t *termParts) fenceChanged(f *coordv1.NodeFence) {
	t.a.fenceChanged(t.term, f)
	ctx, cancel := context.WithTimeout(t.term.Context(), 5*time.Second)
	defer cancel()
	for _, in := range engine.RecordWritten(f, t.a.now()) {
		_ = t.loop.Step(ctx, in)
	}
}

// standingRecords hands the engine every configured node's newest record, so that the new term
// re-checks every confirmed power-off against every witness (for a full window of its own) and
// holds the automatic fences of the nodes whose record stands. It runs before the runner resumes
// the active records, whose newer versions follow.
func (t *termParts) standingRecords() {
	ctx, cancel := context.WithTimeout(t.term.Context(), 30*time.Second)
	defer cancel()
	// Only the nodes that have records at all are read one by one.
	fenced, err := t.a.store.FencedNodes(ctx, t.a.fences().NodeNames())
	if err != nil {
		t.a.log.Error("cannot list the nodes with fence records; their proofs are not re-checked this term", "err", err)
		return
	}
	for _, node := range fenced {
		f, err := t.a.store.LatestFence(ctx, node)
		if err != nil {
			t.a.log.Error("cannot read the node's newest fence record; its proof is not re-checked this term", "node", node, "err", err)
			continue
		}
		if f != nil {
			_ = t.loop.Step(ctx, engine.FenceRecord{Record: f, At: t.a.now()})
		}
	}
}

// facts tells the runner whether the node is ready and until when it may be dumping its memory.
func (t *termParts) facts(ctx context.Context, node string) (bool, time.Time) {
	var ready bool
	var kdumpUntil time.Time
	_ = t.loop.Query(ctx, func(e *engine.Engine) {
		ready = fencing.Alive(e.Node(node))
		kdumpUntil = e.KdumpUntil(node)
	})
	return ready, kdumpUntil
}

// contact tells the runner when a witness of the node was last heard, for the re-check of an
// automatic fence before each driver call. When the engine cannot answer (the term is ending),
// the contact is "now": the call is not made.
func (t *termParts) contact(ctx context.Context, node string) fencing.Contact {
	c := fencing.Contact{Witness: "witness (the engine did not answer)", At: t.a.now(), Grace: t.a.cfg.Engine.NodeMonitorGracePeriod}
	_ = t.loop.Query(ctx, func(e *engine.Engine) {
		c = e.Contact(node)
	})
	return c
}

// start runs the term's parts until the term ends: the loop first, then the API's access to the
// term, the device checks, the history's upkeep, the Kubernetes mirror's term, and the resumption
// of every active fence record.
func (t *termParts) start() {
	a, term := t.a, t.term
	t.jobs.Add(
		job.OneShot("audit-writer", func(ctx context.Context) error { t.audit.Run(ctx); return nil }),
		job.OneShot("record-writer", t.writer.run),
		job.OneShot("engine-loop", func(ctx context.Context) error {
			if err := t.loop.Run(ctx); err != nil {
				a.log.Error("engine loop stopped; resigning", "err", err)
				t.resign()
			}
			return nil
		}))
	t.jobs.Start(term.Context())
	a.mu.Lock()
	a.leading = &api.Leading{Term: term, Runner: t.runner, Loop: t.loop, Leases: t.leases}
	a.mu.Unlock()
	t.jobs.Add(job.Timer("device-checks", a.cfg.DeviceCheckInterval,
		func(ctx context.Context) error { a.devices.checkAll(ctx, a, t.secrets); return nil }))
	if n, err := a.store.IndexHistory(term.Context(), term); err != nil {
		a.log.Error("cannot index the fence history; older records are missing from listings until the next term", "err", err)
	} else if n > 0 {
		a.log.Info("indexed the fence history by time", "records", n)
	}
	t.jobs.Add(job.Timer("prune-history", pruneEvery, func(ctx context.Context) error { a.pruneHistory(ctx, term); return nil }, job.Immediately()))
	if a.cfg.Retention.AuditMaxEntries > 0 || a.cfg.Retention.AuditMaxAge > 0 {
		t.jobs.Add(job.Timer("prune-audit", store.AuditPruneEvery, func(ctx context.Context) error { a.pruneAudit(ctx, term); return nil }))
	}
	if a.kube != nil {
		a.kube.startTerm(term, t.loop, t.jobs, t.writer.wouldRelease)
	}
	t.standingRecords()
	active, err := a.store.ActiveFences(term.Context())
	if err != nil {
		a.log.Error("cannot list records to resume; they resume at the next term", "err", err)
		return
	}
	for _, f := range active {
		a.log.Info("resuming fence record", "fence", f.Id, "node", f.Node, "status", f.Status.String())
		t.runner.Start(f.Id)
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
	if p := fencing.ProofName(f.Proof); p != "" {
		text += "; proof: " + p
	}
	if f.FinishedAt != nil {
		text += "; finished"
		if f.Error != "" {
			text += ": " + f.Error
		}
	}
	kind := "fence"
	if fencing.AbortedReaching(f) {
		kind = "fence-aborted"
	}
	a.audit(term, f.Node, kind, text)
	a.metrics.ObserveFence(f)
	a.fenceMx.observe(f)
	if a.kube != nil {
		a.kube.onFence(f)
	}
}

// audit appends one entry to the audit trail under the term's epoch, through the term's audit
// writer: the caller (a fence runner, say) never waits for it.
func (a *App) audit(term *leader.Term, node, kind, text string) {
	if w := a.storeG.writer(term); w != nil {
		w.Append(a.now(), node, kind, text)
		return
	}
	ctx, cancel := context.WithTimeout(term.Context(), auditTimeout)
	defer cancel()
	if _, err := term.Txn(ctx, nil, a.store.AuditOp(a.now(), term.Epoch, node, kind, text)); err != nil {
		a.log.Warn("audit entry not written", "node", node, "kind", kind, "err", err)
	}
}

// Timings of the election loop and the term's upkeep.
const (
	// followerPoll is how often a replica that does not lead rereads who does.
	followerPoll = 100 * time.Millisecond
	// campaignRetry is the pause after a failed campaign.
	campaignRetry = time.Second
	// reachTimeout bounds the check that the advertised address accepts connections.
	reachTimeout = 2 * time.Second
	// resignTimeout bounds the resignation when the replica stops or its loop fails.
	resignTimeout = 2 * time.Second
	// auditTimeout bounds one audit entry's write.
	auditTimeout = 5 * time.Second
	// pruneEvery is how often the leader prunes the history beyond the retention, and
	// pruneTimeout bounds one pass.
	pruneEvery, pruneTimeout = 5 * time.Minute, time.Minute
)

// pruneHistory deletes history beyond the retention: one pass of the term's prune-history job,
// at the start of the term and every pruneEvery.
func (a *App) pruneHistory(ctx context.Context, term *leader.Term) {
	pctx, cancel := context.WithTimeout(ctx, pruneTimeout)
	p, err := a.store.Prune(pctx, term, a.now(), a.cfg.Retention)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		a.log.Warn("pruning the history failed; retrying at the next pass", "err", err)
	case p.Fences > 0 || p.Audit > 0:
		a.log.Info("pruned the history", "fence_records", p.Fences, "audit_entries", p.Audit)
	}
}

// leases starts the term's watchdog leases at the term's start: no grant of an earlier leader left
// after it (services/wdlease).
func (a *App) leases(term *leader.Term) *api.Leases {
	b := wdlease.Defaults(0)
	b.Lease = a.cfg.watchdogLease()
	return api.NewLeases(b, term.Epoch, a.now())
}

package chaos

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The invariants are checked while the run goes, as well as at its end (Verify): a violation is
// reported with the step that was running when it was first seen, so a failed run names the fault
// that broke it rather than only what the end looked like.

// observation is one look at the run: the fence records (any coordinator's answer), every BMC's
// call log, the driver's operations and the nodes whose agents were killed so far.
type observation struct {
	records []*coordv1.NodeFence
	calls   map[string][]string
	ops     []driverOp
	dead    map[string]bool
}

// violations are the invariants o breaks, keyed so that one violation seen again is reported once:
// no node powered off twice, no live node powered off or given a record, no record proven off by
// read-back whose BMC was never switched off, no driver call with a stale epoch. The records are
// listed before the calls are read, so a record confirmed by read-back has its power-off in the log.
func (o observation) violations() map[string]string {
	out := map[string]string{}
	offs := map[string]int{}
	for node, calls := range o.calls {
		offs[node] = ipmisim.PowerOffs(calls)
		if offs[node] > 1 {
			out["twice "+node] = fmt.Sprintf("node %s was powered off %d times", node, offs[node])
		}
		if offs[node] > 0 && !o.dead[node] {
			out["live-off "+node] = fmt.Sprintf("node %s, whose agent is alive, was powered off", node)
		}
	}
	for _, f := range o.records {
		if !o.dead[f.Node] {
			out["live-record "+f.Id] = fmt.Sprintf("node %s, whose agent is alive, got fence record %s (%s)", f.Node, f.Id, f.Status)
		}
		if f.ConfirmedOffAt != nil && f.Proof == coordv1.FenceProof_FENCE_PROOF_READ_BACK && offs[f.Node] == 0 {
			out["unproven "+f.Id] = fmt.Sprintf("record %s says %s was read back off, but its BMC was never switched off", f.Id, f.Node)
		}
	}
	staleEpochs(o.ops, func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		out["stale "+msg] = msg
	})
	return out
}

// Records watches the run: the records it saw (so the end can tell whether one was lost) and the
// violations of the invariants, each with the step during which it was first seen.
type Records struct {
	c    *Cluster
	mu   sync.Mutex
	seen map[string]string // record id -> node
	dead map[string]bool
	step string
	// found holds each violation's message with its step, first seen first (order).
	found map[string]string
	order []string
	// looks counts the observations taken whole (records, every BMC's calls, the driver's log).
	looks int
}

// Watch looks at the run every interval until ctx ends.
func (c *Cluster) Watch(ctx context.Context, interval time.Duration) *Records {
	r := &Records{c: c, seen: map[string]string{}, dead: map[string]bool{}, step: "before the first step", found: map[string]string{}}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			r.look(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// during tells the watcher which step runs now and which nodes' agents are dead.
func (r *Records) during(step string, dead map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step, r.dead = step, maps.Clone(dead)
}

// look takes one observation and keeps what it violates. A look whose records or logs cannot be
// read is skipped: the end's Verify reports what stays unreadable.
func (r *Records) look(ctx context.Context) {
	fs, err := r.c.ListFences(ctx)
	if err != nil {
		return
	}
	r.mu.Lock()
	o := observation{records: fs, calls: map[string][]string{}, dead: maps.Clone(r.dead)}
	step := r.step
	for _, f := range fs {
		r.seen[f.Id] = f.Node
	}
	r.mu.Unlock()
	for _, n := range r.c.Nodes {
		calls, err := r.c.BMCs[n].Calls()
		if err != nil {
			return
		}
		o.calls[n] = calls
	}
	if o.ops, err = driverOps(r.c.Driver.Log); err != nil {
		return
	}
	v := o.violations()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.looks++
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := r.found[k]; !ok {
			r.found[k] = fmt.Sprintf("during %s: %s", step, v[k])
			r.order = append(r.order, k)
		}
	}
}

// Looks is how many whole observations were taken: a run checked zero times proved nothing.
func (r *Records) Looks() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.looks
}

// Violations are the violations seen while the run went, first seen first.
func (r *Records) Violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.order))
	for _, k := range r.order {
		out = append(out, r.found[k])
	}
	return out
}

package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// MaintenanceController drains the Nodes nodefence put in maintenance with a drain: each pass
// evicts, through the Eviction API, every pod DrainPlan moves that is not already terminating. A
// refused eviction (a PodDisruptionBudget, 429) is tried again after EvictRetry, as kubectl drain
// does. It keeps only the last attempt per pod, for progress reports: a new leader's controller
// starts from the Nodes' annotations and the pods as they are.
type MaintenanceController struct {
	w     *Writer
	nodes func() ([]*corev1.Node, error)
	log   *slog.Logger
	now   func() time.Time
	// OnEvict, if set, is told of each eviction the API accepted (for Events and the audit trail).
	OnEvict func(node string, pod *corev1.Pod)

	mu    sync.Mutex
	tried map[string]map[types.UID]PodAttempt // by node, then pod
}

// EvictRetry is how long a refused eviction waits before it is tried again (kubectl drain waits 5 s).
const EvictRetry = 5 * time.Second

// NewMaintenanceController returns a controller that finds the Nodes with nodes (an informer's
// lister) and writes through w.
func NewMaintenanceController(w *Writer, nodes func() ([]*corev1.Node, error), log *slog.Logger, now func() time.Time) *MaintenanceController {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	return &MaintenanceController{w: w, nodes: nodes, log: log, now: now, tried: map[string]map[types.UID]PodAttempt{}}
}

// Run makes a pass every interval until ctx ends.
func (c *MaintenanceController) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.Pass(pctx); err != nil && ctx.Err() == nil {
			c.log.Warn("maintenance pass failed; retrying", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass drains every Node in maintenance with a drain once.
func (c *MaintenanceController) Pass(ctx context.Context) error {
	nodes, err := c.nodes()
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	draining := map[string]bool{}
	var errs []error
	for _, n := range nodes {
		if active, _, st := MaintenanceOf(n); !active || !st.Drain {
			continue
		}
		draining[n.Name] = true
		if err := c.drain(ctx, n.Name); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	for node := range c.tried {
		if !draining[node] {
			delete(c.tried, node)
		}
	}
	c.mu.Unlock()
	return errors.Join(errs...)
}

// drain evicts the node's pods that are due.
func (c *MaintenanceController) drain(ctx context.Context, node string) error {
	move, _, err := c.w.drainPlan(ctx, node)
	if err != nil {
		return err
	}
	for i := range move {
		p := &move[i]
		if p.DeletionTimestamp != nil || !c.due(node, p.UID) {
			continue
		}
		err := c.w.Evict(ctx, p)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a := attemptOf(err, c.now())
		c.record(node, p.UID, a)
		switch {
		case err == nil:
			c.log.Info("maintenance: evicted", "node", node, "pod", p.Namespace+"/"+p.Name)
			if c.OnEvict != nil {
				c.OnEvict(node, p)
			}
		case a.State == coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_BLOCKED:
			c.log.Info("maintenance: eviction refused by a disruption budget; retrying", "node", node, "pod", p.Namespace+"/"+p.Name)
		default:
			c.log.Warn("maintenance: eviction failed; retrying", "node", node, "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
	return nil
}

// due tells whether the pod's eviction may be tried now.
func (c *MaintenanceController) due(node string, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.tried[node][uid]
	return !ok || c.now().Sub(a.At) >= EvictRetry
}

func (c *MaintenanceController) record(node string, uid types.UID, a PodAttempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tried[node] == nil {
		c.tried[node] = map[types.UID]PodAttempt{}
	}
	c.tried[node][uid] = a
}

// View reports node's maintenance with the outcome of the latest eviction of each pod.
func (c *MaintenanceController) View(ctx context.Context, node string) (*coordv1.Maintenance, error) {
	c.mu.Lock()
	tried := make(map[types.UID]PodAttempt, len(c.tried[node]))
	for uid, a := range c.tried[node] {
		tried[uid] = a
	}
	c.mu.Unlock()
	return c.w.MaintenanceView(ctx, node, tried)
}

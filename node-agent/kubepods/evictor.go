package kubepods

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Evictor defaults.
const (
	DefaultRetryInterval  = 5 * time.Second
	DefaultMaxRetryDelay  = time.Minute
	DefaultGiveUpAfter    = 5 * time.Minute
	DefaultMinGracePeriod = time.Second
)

// EvictorConfig configures an Evictor.
type EvictorConfig struct {
	// RetryInterval is how long to wait before trying again an eviction the apiserver refused for
	// now (429, as for a PodDisruptionBudget that allows no disruption; 5xx; timeouts) when it
	// suggests no delay of its own. Default 5s.
	RetryInterval time.Duration
	// MaxRetryDelay caps the delay the apiserver suggests (Retry-After). Default 1m.
	MaxRetryDelay time.Duration
	// GiveUpAfter is how long a granted eviction is retried before it is dropped; the coordinator
	// grants again if the pressure remains. Default 5m.
	GiveUpAfter time.Duration
	// MinGracePeriod is the smallest grace period sent with an eviction. A grant's 0 (a hard
	// threshold) would make the apiserver remove the pod object at once, before the kubelet has
	// stopped its containers, like a force delete: a StatefulSet could then start the same
	// identity elsewhere while the old one still runs. Default 1s.
	MinGracePeriod time.Duration
	// Done, when set, is told how every granted eviction ended: Evicted, Gone, or Failed (refused
	// for good, or still refused after GiveUpAfter). The agent reports it to the coordinator.
	Done func(c eviction.Candidate, signal string, out Outcome, err error)
	// Log nil means slog.Default().
	Log *slog.Logger
}

// SetDefaults fills the zero fields.
func (c *EvictorConfig) SetDefaults() {
	if c.RetryInterval <= 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.MaxRetryDelay <= 0 {
		c.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if c.GiveUpAfter <= 0 {
		c.GiveUpAfter = DefaultGiveUpAfter
	}
	if c.MinGracePeriod <= 0 {
		c.MinGracePeriod = DefaultMinGracePeriod
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Outcome is how one eviction attempt ended.
type Outcome int

// The outcomes of an eviction attempt.
const (
	// Evicted: the apiserver accepted the eviction; the pod is terminating.
	Evicted Outcome = iota + 1
	// Gone: the pod no longer exists, or the name now belongs to another pod (another uid).
	Gone
	// Retry: refused for now (a PodDisruptionBudget, an overloaded or unreachable apiserver).
	Retry
	// Failed: refused for good (forbidden, invalid); not retried.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Evicted:
		return "evicted"
	case Gone:
		return "gone"
	case Retry:
		return "retry"
	case Failed:
		return "failed"
	}
	return "Outcome(?)"
}

// pending is a granted eviction not carried out yet.
type pending struct {
	cand     eviction.Candidate
	signal   string
	granted  time.Time
	due      time.Time
	attempts int
}

// queue is the Evictor's bookkeeping, pure: time comes in as now.
type queue struct{ items []*pending }

func sameTarget(a, b eviction.Candidate) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID
}

// add queues c, granted for signal, due at once; a pod already queued keeps its place and takes
// the newer grace period and signal.
func (q *queue) add(c eviction.Candidate, signal string, now time.Time) {
	for _, p := range q.items {
		if sameTarget(p.cand, c) {
			p.cand.GracePeriod, p.signal, p.due = c.GracePeriod, signal, now
			return
		}
	}
	q.items = append(q.items, &pending{cand: c, signal: signal, granted: now, due: now})
}

// takeDue removes and returns the items due at now, in grant order.
func (q *queue) takeDue(now time.Time) []*pending {
	var due []*pending
	q.items = slices.DeleteFunc(q.items, func(p *pending) bool {
		if !p.due.After(now) {
			due = append(due, p)
			return true
		}
		return false
	})
	return due
}

// next returns when the earliest item is due.
func (q *queue) next() (time.Time, bool) {
	var t time.Time
	for i, p := range q.items {
		if i == 0 || p.due.Before(t) {
			t = p.due
		}
	}
	return t, len(q.items) > 0
}

// Evictor evicts granted pods through the Eviction API. It implements agent.GrantHandler. Create
// it with NewEvictor and call Run once.
type Evictor struct {
	client *Client
	cfg    EvictorConfig
	log    *slog.Logger
	wake   chan struct{}

	mu       sync.Mutex
	q        queue
	inFlight int // taken from q and being attempted
}

// NewEvictor returns an Evictor using client, which needs create on pods/eviction and get on pods.
func NewEvictor(client *Client, cfg EvictorConfig) *Evictor {
	cfg.SetDefaults()
	return &Evictor{client: client, cfg: cfg, log: cfg.Log.With("component", "evictor"), wake: make(chan struct{}, 1)}
}

// Grant queues the granted pods for eviction and returns at once (it runs on the coordinator
// stream's receive loop). A missing grace period is 0, as for a hard threshold.
func (e *Evictor) Grant(g *agentv1.EvictionGrant) {
	now := time.Now()
	e.mu.Lock()
	for _, p := range g.GetPods() {
		e.q.add(eviction.Candidate{Namespace: p.Namespace, Name: p.Name, UID: p.Uid,
			GracePeriod: p.GetGracePeriod().AsDuration()}, g.GetSignal(), now)
	}
	e.mu.Unlock()
	e.log.Info("eviction granted", "signal", g.GetSignal(), "pods", len(g.GetPods()))
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Pending returns how many granted evictions wait to be carried out or retried.
func (e *Evictor) Pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.q.items) + e.inFlight
}

// Run carries out the granted evictions until ctx is done, then returns nil.
func (e *Evictor) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		e.mu.Lock()
		due := e.q.takeDue(now)
		e.inFlight = len(due)
		e.mu.Unlock()
		for _, p := range due {
			again := e.attempt(ctx, p)
			e.mu.Lock()
			if again {
				e.q.items = append(e.q.items, p)
			}
			e.inFlight-- // in the same critical section: Pending never counts p twice or not at all
			e.mu.Unlock()
		}
		if ctx.Err() != nil {
			return nil
		}
		e.mu.Lock()
		next, ok := e.q.next()
		e.mu.Unlock()
		wait := time.Hour
		if ok {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-e.wake:
		case <-timer.C:
		}
	}
}

// attempt tries p once; it reports whether p is to be retried (with p.due set).
func (e *Evictor) attempt(ctx context.Context, p *pending) bool {
	c := p.cand
	log := e.log.With("pod", c.Namespace+"/"+c.Name, "uid", c.UID, "grace_period", c.GracePeriod)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	out, delay, err := e.Evict(actx, c)
	cancel()
	p.attempts++
	now := time.Now()
	done := func(out Outcome) {
		if e.cfg.Done != nil {
			e.cfg.Done(c, p.signal, out, err)
		}
	}
	switch out {
	case Evicted:
		log.Info("pod evicted", "attempts", p.attempts)
		done(Evicted)
		return false
	case Gone:
		log.Info("granted pod is gone already")
		done(Gone)
		return false
	case Failed:
		log.Error("eviction refused; giving up", "error", err)
		done(Failed)
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	if now.Sub(p.granted) >= e.cfg.GiveUpAfter {
		log.Warn("eviction still refused; giving up on the grant", "attempts", p.attempts, "error", err)
		done(Failed)
		return false
	}
	if delay <= 0 {
		delay = e.cfg.RetryInterval
	}
	if p.attempts == 1 {
		log.Info("eviction refused for now; retrying later", "retry_in", delay, "error", err)
	} else {
		log.Debug("eviction refused again", "attempts", p.attempts, "retry_in", delay, "error", err)
	}
	p.due = now.Add(delay)
	return true
}

// Evict asks the Eviction API once to evict c, with c's grace period (at least MinGracePeriod)
// and c's uid as a precondition, so a new pod that took the name is never evicted in its place. A
// refusal by a PodDisruptionBudget is Retry with the delay the apiserver suggests (0 when none, at
// most MaxRetryDelay); the pod is never deleted directly.
func (e *Evictor) Evict(ctx context.Context, c eviction.Candidate) (out Outcome, delay time.Duration, err error) {
	grace := gracePeriodSeconds(c.GracePeriod, e.cfg.MinGracePeriod)
	opts := &metav1.DeleteOptions{GracePeriodSeconds: &grace}
	if c.UID != "" {
		uid := types.UID(c.UID)
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	ev := &Eviction{Metadata: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}, DeleteOptions: opts}
	err = e.client.Evict(ctx, ev)
	switch {
	case err == nil:
		return Evicted, 0, nil
	case apierrors.IsNotFound(err):
		return Gone, 0, err
	case apierrors.IsConflict(err):
		// A failed uid precondition, or a PodDisruptionBudget update that raced: look.
		pod, gerr := e.client.GetPod(ctx, c.Namespace, c.Name)
		if apierrors.IsNotFound(gerr) || (gerr == nil && c.UID != "" && string(pod.UID) != c.UID) {
			return Gone, 0, err
		}
		return Retry, 0, err
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		if s, ok := apierrors.SuggestsClientDelay(err); ok && s > 0 {
			delay = min(time.Duration(s)*time.Second, e.cfg.MaxRetryDelay)
		}
		return Retry, delay, err
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsUnauthorized(err):
		return Failed, 0, err
	case errors.Is(err, context.Canceled):
		return Retry, 0, err
	}
	// Anything else (the network) may pass.
	return Retry, 0, err
}

// gracePeriodSeconds rounds d up to whole seconds, at least floor.
func gracePeriodSeconds(d, floor time.Duration) int64 {
	d = max(d, floor)
	return int64(math.Ceil(d.Seconds()))
}

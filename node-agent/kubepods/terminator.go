package kubepods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// DefaultPollInterval is how often Terminator looks whether the deleted pods are gone.
const DefaultPollInterval = 500 * time.Millisecond

// TerminatorConfig configures a Terminator.
type TerminatorConfig struct {
	// PollInterval is how often the deleted pods are looked for. Default 500ms.
	PollInterval time.Duration
	// MinGracePeriod is the smallest grace period a delete carries (see
	// EvictorConfig.MinGracePeriod for why not 0). Default 1s.
	MinGracePeriod time.Duration
	// Log nil means slog.Default().
	Log *slog.Logger
}

// Terminator deletes the pods of a graceful node shutdown's phase through the API. It implements
// shutdown.Terminator.
type Terminator struct {
	client *Client
	cfg    TerminatorConfig
	log    *slog.Logger
}

// NewTerminator returns a Terminator using client, which needs get and delete on pods.
func NewTerminator(client *Client, cfg TerminatorConfig) *Terminator {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MinGracePeriod <= 0 {
		cfg.MinGracePeriod = DefaultMinGracePeriod
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Terminator{client: client, cfg: cfg, log: cfg.Log.With("component", "terminator")}
}

// Terminable reports whether a shutdown deletes the pod through the API: not a DaemonSet's pod
// (its controller would put it back on the node at once) and not a static pod (the kubelet runs it
// from a file; deleting its mirror pod does not stop it).
func Terminable(p *eviction.Pod) bool { return !p.DaemonSet && !p.Static }

// deleteTimeout bounds the deletes of one phase when the phase's own time is already up.
const deleteTimeout = 10 * time.Second

// Terminate deletes the terminable pods (see Terminable) gracefully, each with the smaller of
// grace and its own terminationGracePeriodSeconds (kubelet's shutdown manager), rounded up to
// seconds and at least MinGracePeriod, with its uid as a precondition, and waits until they are
// gone. The deletes are sent even when ctx's deadline has passed already, as for a phase whose
// grace is 0 (kubelet kills those pods at once); a cancelled ctx (the shutdown was called off)
// sends none. It returns nil when the pods are gone, or an error naming how many remain when ctx
// ends first; failed deletes are reported in the error too.
func (t *Terminator) Terminate(ctx context.Context, pods []eviction.Pod, grace time.Duration) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	stopped := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stopped()
	var errs []error
	var waiting []eviction.Pod
	for _, p := range pods {
		secs := gracePeriodSeconds(min(grace, max(p.GracePeriod, 0)), t.cfg.MinGracePeriod)
		log := t.log.With("pod", p.Namespace+"/"+p.Name, "uid", p.UID)
		if !Terminable(&p) {
			log.Info("not deleting a DaemonSet or static pod", "daemonset", p.DaemonSet, "static", p.Static)
			continue
		}
		opts := metav1.DeleteOptions{GracePeriodSeconds: &secs}
		if p.UID != "" {
			uid := types.UID(p.UID)
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		err := t.client.DeletePod(dctx, p.Namespace, p.Name, opts)
		switch {
		case err == nil:
			log.Info("deleting pod for the node shutdown", "grace_period_seconds", secs)
			waiting = append(waiting, p)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or the name belongs to another pod now.
		default:
			log.Warn("deleting pod failed", "error", err)
			errs = append(errs, fmt.Errorf("deleting %s/%s: %w", p.Namespace, p.Name, err))
			waiting = append(waiting, p) // it may still go
		}
	}
	tick := time.NewTicker(t.cfg.PollInterval)
	defer tick.Stop()
	for {
		waiting = t.remaining(ctx, waiting)
		if len(waiting) == 0 {
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("%d pod(s) not gone (first %s/%s): %w", len(waiting), waiting[0].Namespace, waiting[0].Name, context.Cause(ctx)))
			return errors.Join(errs...)
		case <-tick.C:
		}
	}
}

// remaining returns the pods that still exist with their uid (or cannot be looked up).
func (t *Terminator) remaining(ctx context.Context, pods []eviction.Pod) []eviction.Pod {
	var out []eviction.Pod
	for _, p := range pods {
		got, err := t.client.GetPod(ctx, p.Namespace, p.Name)
		if apierrors.IsNotFound(err) || (err == nil && p.UID != "" && string(got.UID) != p.UID) {
			continue
		}
		out = append(out, p)
	}
	return out
}

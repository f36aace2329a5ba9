// Package kube is the coordinator's Kubernetes side: the Witness reads Nodes and the kubelets'
// Leases (the second witness of a node's death) for the engine; the Reconciler, a level-triggered
// controller on a client-go work queue, releases the workloads of nodes proven off and restores
// nodes that came back; the Writer makes the API calls.
//
// One owner per field: nodefence writes only the out-of-service taint, its own Node condition
// nodefence.io/AgentReady, NodeFence objects and Events, all as field manager FieldManager. The Ready
// condition, the pressure conditions and the not-ready/unreachable taints belong to kubelet and
// kube-controller-manager, and nothing here writes them.
//
// Every method is one idempotent step the coordinator's loop can retry: it reads the current
// object, computes the change with a pure function, and writes only when something changes, with
// optimistic concurrency (a conflict re-reads and retries). Decisions stay in the engine; this
// package never decides on its own to taint, release or fence a node.
//
// ReleaseNode is the dangerous one: call it only after a power-off or isolation has been confirmed
// by a status read-back (the seed's non-graceful shutdown, node.kubernetes.io/out-of-service).
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// FieldManager names the coordinator in managedFields and server-side apply.
const FieldManager = "nodefence-coordinator"

// conflictBackoff paces re-reads after a 409 Conflict on a Node: kubelet, kube-controller-manager
// and operators write Nodes too, so a few jittered retries are normal.
var conflictBackoff = wait.Backoff{Steps: 12, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: time.Second}

// Options tune a Writer. The zero value is usable.
type Options struct {
	// Now is the clock for taint timeAdded and condition times; nil means time.Now.
	Now func() time.Time
	// Log receives one line per change written; nil discards.
	Log *slog.Logger
}

// Writer writes the coordinator's decisions to the Kubernetes API. It is safe for concurrent use;
// concurrent writes to the same Node are serialised by the apiserver's resourceVersion checks.
type Writer struct {
	core kubernetes.Interface
	dyn  dynamic.Interface
	now  func() time.Time
	log  *slog.Logger
}

// New returns a Writer for cfg. It does not contact the apiserver.
func New(cfg *rest.Config, opts Options) (*Writer, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = FieldManager
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return NewWithClients(core, dyn, opts), nil
}

// Dynamic is the writer's dynamic client (the custom resources).
func (w *Writer) Dynamic() dynamic.Interface { return w.dyn }

// NewWithClients returns a Writer over existing clients (shared with informers, for example).
func NewWithClients(core kubernetes.Interface, dyn dynamic.Interface, opts Options) *Writer {
	w := &Writer{core: core, dyn: dyn, now: opts.Now, log: opts.Log}
	if w.now == nil {
		w.now = time.Now
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	return w
}

// patchNode applies the JSON merge patch edit computes from the current Node (nil: nothing to
// do), guarded by the resourceVersion it read, re-reading on conflict: every Node write of the
// coordinator (its taint, the maintenance annotations and cordon) goes through it.
func (w *Writer) patchNode(ctx context.Context, node string, edit func(*corev1.Node) (map[string]any, error)) error {
	return retry.RetryOnConflict(conflictBackoff, func() error {
		n, err := w.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p, err := edit(n)
		if err != nil || p == nil {
			return err
		}
		md, _ := p["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			p["metadata"] = md
		}
		md["resourceVersion"] = n.ResourceVersion
		raw, err := json.Marshal(p)
		if err != nil {
			return err
		}
		_, err = w.core.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, raw, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
}

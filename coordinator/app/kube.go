package app

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/release"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/job"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// kubeMode is the coordinator's Kubernetes side. It reads the fence ConfigMaps, and through the
// kube.Witness the Nodes and the kubelets' Leases (the second witness); it acts on the apiserver
// only through the per-term kube.Reconciler (release, recovery, nodefence's own Node condition,
// the NodeFence mirror) and the Events recorder. It never writes what kubelet or
// kube-controller-manager owns: Ready, the pressure conditions, the not-ready/unreachable taints.
type kubeMode struct {
	a        *App
	core     kubernetes.Interface
	writer   *kube.Writer
	policy   kube.Policy
	witness  *kube.Witness
	recorder record.EventRecorder
	rec      atomic.Pointer[kube.Reconciler]            // the current term's, nil when not leading
	rem      atomic.Pointer[kube.RemediationController] // the current term's, nil when not leading
	maint    atomic.Pointer[kube.MaintenanceController] // the current term's, nil when not leading

	// secrets keeps the last value read of every Secret key a fence method refers to, so that a
	// fence still has its device credentials while the apiserver is away (a node failure and an
	// apiserver outage often come together). Bounded by the fence configuration's references.
	secretsMu sync.Mutex
	secrets   map[string]string
}

// Timings of the Kubernetes mode.
const (
	// configReloadEvery is the backstop reload of the fence ConfigMaps (changes reload at once).
	configReloadEvery = 30 * time.Second
	// reconcileEvery is the reconciler's pass over every Node besides the passes events ask for.
	reconcileEvery = 5 * time.Minute
)

func kubeRESTConfig(cfg Config) (*rest.Config, error) {
	if cfg.KubeREST != nil {
		return cfg.KubeREST, nil
	}
	if cfg.Kubeconfig == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
}

func newKubeMode(a *App, rc *rest.Config) (*kubeMode, error) {
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = kube.FieldManager
	}
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	w, err := kube.New(rc, kube.Options{Log: a.log, Now: a.now})
	if err != nil {
		return nil, err
	}
	p, err := kube.ParsePolicy(a.cfg.FencePolicy)
	if err != nil {
		return nil, fmt.Errorf("--fence-policy: %w", err)
	}
	sel, err := labels.Parse(a.cfg.ControlPlaneSelector)
	if err != nil {
		return nil, fmt.Errorf("--control-plane-selector: %w", err)
	}
	k := &kubeMode{a: a, core: core, writer: w, policy: p}
	k.witness = kube.NewWitness(core, kube.WitnessOptions{ControlPlane: sel, Log: a.log, Now: a.now,
		Fenceable: func(node string) bool { return a.fences() != nil && a.fences().HasNode(node) }})
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: core.CoreV1().Events("")})
	k.recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nodefence-coordinator"})
	return k, nil
}

// loadConfig reads the seed's fence ConfigMaps from the namespace.
func (k *kubeMode) loadConfig(ctx context.Context) (*fenceconfig.Config, error) {
	list, err := k.core.CoreV1().ConfigMaps(k.a.cfg.FenceNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list fence ConfigMaps in %s: %w", k.a.cfg.FenceNamespace, err)
	}
	var cms []fenceconfig.ConfigMap
	for _, cm := range list.Items {
		if !strings.HasPrefix(cm.Name, fenceconfig.ConfigPrefix) && !strings.HasPrefix(cm.Name, fenceconfig.MethodPrefix) && !strings.HasPrefix(cm.Name, fenceconfig.HostMapPrefix) {
			continue
		}
		c := fenceconfig.ConfigMap{Kind: "ConfigMap", Data: cm.Data, Source: "ConfigMap " + cm.Namespace + "/" + cm.Name}
		c.Metadata.Name, c.Metadata.Namespace = cm.Name, cm.Namespace
		cms = append(cms, c)
	}
	c, err := fenceconfig.FromConfigMaps(cms, k.a.cfg.driverMap())
	if err != nil {
		return nil, err
	}
	return c, c.Validate()
}

// start adds the process's Kubernetes jobs to g: the witness's informers, and the reload of the
// fence ConfigMaps when they change (every 30 s as a backstop).
func (k *kubeMode) start(g *job.Group) {
	_, _ = k.witness.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.enqueue(o) },
		UpdateFunc: func(_, o any) { k.enqueue(o) },
	})
	g.Go("kube-witness", func(ctx context.Context) error { k.witness.Run(ctx); return nil })
	g.Go("kube-fence-config", func(ctx context.Context) error { k.reloadConfig(ctx); return nil })
}

// reloadConfig reloads the fence ConfigMaps when they change, and every configReloadEvery, until
// ctx ends; the ConfigMaps' informer is shut down (and waited for) then.
func (k *kubeMode) reloadConfig(ctx context.Context) {
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	cms := informers.NewSharedInformerFactoryWithOptions(k.core, 0, informers.WithNamespace(k.a.cfg.FenceNamespace))
	_, _ = cms.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() },
	})
	cms.Start(ctx.Done())
	defer cms.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			k.reload(ctx)
		case <-k.a.clock().After(configReloadEvery):
			k.reload(ctx)
		}
	}
}

func (k *kubeMode) enqueue(o any) {
	if n, ok := o.(*corev1.Node); ok {
		if r := k.rec.Load(); r != nil {
			r.Enqueue(n.Name)
		}
	}
}

// reload re-reads the fence ConfigMaps and tells the engine which Nodes are fenceable now. An
// invalid configuration is logged and the previous one kept.
func (k *kubeMode) reload(ctx context.Context) {
	c, err := k.loadConfig(ctx)
	if err != nil {
		k.a.log.Error("fence ConfigMaps invalid; keeping the previous configuration", "err", err)
		return
	}
	k.a.fenceCf.Store(c)
	k.witness.Refresh()
}

// startTerm connects a new term to the cluster: the witness feeds its engine, and a release
// reconciler, the remediation and the maintenance controllers run as jobs of the term's group g.
func (k *kubeMode) startTerm(term *leader.Term, lp *loop.Loop, g *job.Group,
	wouldRelease func(context.Context, string, *coordv1.NodeFence, string) (*coordv1.NodeFence, error)) {
	ctx := term.Context()
	g.Go("warm-secrets", func(context.Context) error { warmSecrets(k.a.fences(), k.secret); return nil })
	sink := k.witness.SetSink(func(in engine.Input) {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = lp.Step(sctx, in)
	})
	r := kube.NewReconciler(k.writer, k.witness.Nodes, releaseFacts{a: k.a, lp: lp}, kube.ReconcilerOptions{
		HealthyDelay: k.a.cfg.ReleaseHealthyDelay, Recorder: k.recorder, Log: k.a.log, Now: k.a.now,
		OnRelease: func(node string, f *coordv1.NodeFence, rel kube.Released) {
			if f.GetConfirmedOffAt() != nil {
				k.a.metrics.ObserveStage("release", k.a.now().Sub(f.ConfirmedOffAt.AsTime()))
				k.a.metrics.ObserveRecovery(f, loop.RecoveryReleased, k.a.now())
			}
			k.a.audit(term, node, "release", fmt.Sprintf("fence %s confirmed off: out-of-service taint; deleted pods %v; deleted volumeattachments %v; kept %v",
				f.GetId(), rel.DeletedPods, rel.DeletedVolumeAttachments, rel.KeptPods))
		},
		OnRecover: func(node, why string) {
			k.a.audit(term, node, "release", why+": out-of-service taint removed")
		},
		OnWouldRelease: wouldRelease,
	})
	k.rec.Store(r)
	g.Go("release-reconciler-detach", func(ctx context.Context) error {
		<-ctx.Done()
		k.rec.CompareAndSwap(r, nil)
		k.witness.ClearSink(sink)
		return nil
	})
	g.Go("release-reconciler", func(ctx context.Context) error { r.Run(ctx, reconcileEvery); return nil })
	rc := kube.NewRemediationController(k.writer.Dynamic(), remediationFacts{releaseFacts{a: k.a, lp: lp}}, k.a.log, k.a.now)
	rc.OnRequest = func(node, remediation, fence string) {
		k.a.audit(term, node, "fence-requested", fmt.Sprintf("NodeFenceRemediation %s (spec.allowLiveWitnesses) requested fence %s", remediation, fence))
	}
	k.rem.Store(rc)
	g.Go("remediation-controller-detach", func(ctx context.Context) error {
		<-ctx.Done()
		k.rem.CompareAndSwap(rc, nil)
		return nil
	})
	g.Go("remediation-controller", func(ctx context.Context) error { rc.Run(ctx, remediationEvery); return nil })
	k.startMaintenance(g)
	g.Go("reconcile-every-node", func(ctx context.Context) error {
		// Every Node once: each pass reads the node's newest record, so whatever a previous
		// leader left undone (a release, a restore, a mirror) is finished.
		if cache.WaitForCacheSync(ctx.Done(), k.witness.Informer().HasSynced) {
			r.EnqueueAll()
		}
		return nil
	})
}

// releaseFacts reads what the reconciler needs: records from etcd, judgements from the engine.
type releaseFacts struct {
	a  *App
	lp *loop.Loop
}

func (f releaseFacts) Fence(ctx context.Context, node string) (*coordv1.NodeFence, bool, error) {
	active, err := f.a.store.ActiveFence(ctx, node)
	if err != nil {
		return nil, false, err
	}
	latest, err := f.a.store.LatestFence(ctx, node)
	if err != nil {
		return nil, false, err
	}
	if active != nil && (latest == nil || latest.GetId() < active.Fence.GetId()) {
		latest = active.Fence
	}
	return latest, active != nil && !store.Finished(active.Fence), nil
}

func (f releaseFacts) Node(ctx context.Context, node string) (*coordv1.Node, error) {
	var v *coordv1.Node
	err := f.lp.Query(ctx, func(e *engine.Engine) { v = e.Node(node) })
	return v, err
}

func (f releaseFacts) Proof(ctx context.Context, node string) (release.Proven, error) {
	var p release.Proven
	err := f.lp.Query(ctx, func(e *engine.Engine) { p.Fence, p.Verdict, p.Spoke = e.Proof(node) })
	return p, err
}

// remediationEvery is how often the NodeFenceRemediations are looked at.
const remediationEvery = 2 * time.Second

// remediationFacts adds to releaseFacts what the remediation controller asks of the coordinator.
type remediationFacts struct{ releaseFacts }

func (f remediationFacts) Fenceable(node string) bool {
	cfg := f.a.fences()
	return cfg != nil && cfg.HasNode(node)
}

func (f remediationFacts) RequestFence(ctx context.Context, node, requester, reason string) (string, error) {
	rec, err := f.a.fenceSrv.StartAs(ctx, requester, node, reason, coordv1.FenceAction_FENCE_ACTION_OFF)
	return rec.GetId(), err
}

// eventReasons maps the engine's event kinds about one node to Kubernetes Event reasons and types.
var eventReasons = map[string]struct{ reason, kind string }{
	"readiness":       {"NodefenceReadiness", corev1.EventTypeNormal},
	"agent-down":      {"AgentDown", corev1.EventTypeWarning},
	"kubelet-down":    {"KubeletDown", corev1.EventTypeWarning},
	"eviction":        {"ReleasedByPacing", corev1.EventTypeNormal},
	"fence-requested": {"FenceRequested", corev1.EventTypeWarning},
	"fence-held-back": {"FenceHeldBack", corev1.EventTypeWarning},
	"shutdown":        {"ShutdownAnnounced", corev1.EventTypeNormal},
	"kdump":           {"KernelDump", corev1.EventTypeWarning},
	"proof":           {"FenceProvenDark", corev1.EventTypeNormal},
	"fence-mode":      {"FenceMode", corev1.EventTypeNormal},
	"fence-exclusion": {"FenceExclusion", corev1.EventTypeNormal},
	"maintenance":     {"Maintenance", corev1.EventTypeNormal},
}

// onReady turns the engine's decisions about nodes into Events on their Nodes and a reconciler
// pass over each node concerned. Nothing else is written: the taints the engine grants are its
// pacing tokens, kube-controller-manager taints the Nodes itself.
func (k *kubeMode) onReady(rd engine.Ready) {
	r := k.rec.Load()
	for _, ev := range rd.Events {
		if ev.Kind == "pause" {
			k.eventEveryNode(ev)
		}
		if ev.Node == "" {
			continue
		}
		if m, ok := eventReasons[ev.Kind]; ok {
			reason, kind := m.reason, m.kind
			if (ev.Kind == "agent-down" || ev.Kind == "kubelet-down") && strings.Contains(ev.Text, "no longer down") {
				reason, kind = strings.TrimSuffix(reason, "Down")+"Back", corev1.EventTypeNormal
			}
			k.recorder.Event(kube.NodeRef(ev.Node), kind, reason, ev.Text)
		}
		if r != nil {
			r.Enqueue(ev.Node)
		}
	}
}

// eventEveryNode records a cluster-wide pause or resume on every Node, so that whoever looks at a
// node sees that nodefence will not fence or evict anything automatically, and who said so.
func (k *kubeMode) eventEveryNode(ev engine.Event) {
	nodes, err := k.witness.Nodes.List(labels.Everything())
	if err != nil {
		return
	}
	reason, kind := "NodefencePaused", corev1.EventTypeWarning
	if strings.Contains(ev.Text, "resumed") {
		reason, kind = "NodefenceResumed", corev1.EventTypeNormal
	}
	for _, n := range nodes {
		k.recorder.Event(kube.NodeRef(n.Name), kind, reason, ev.Text+" (cluster-wide)")
	}
}

// onFence records an Event for a fence record's new version on its Node and NodeFence, and asks
// for a reconciler pass over the node (mirror, release).
func (k *kubeMode) onFence(f *coordv1.NodeFence) {
	reason, kind := "FenceProgress", corev1.EventTypeNormal
	switch {
	case f.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_ERROR:
		reason, kind = "FenceFailed", corev1.EventTypeWarning
	case f.GetFinishedAt() != nil:
		reason = "FenceFinished"
	case f.GetConfirmedOffAt() != nil:
		reason = "FenceConfirmed"
	case f.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_NEW && len(f.GetOperations()) == 0:
		reason = "FenceStarted"
	}
	msg := fmt.Sprintf("fence %s (%s): %s %s", f.GetId(), cli.EnumWord(f.GetAction().String()), cli.EnumWord(f.GetStep().String()), cli.EnumWord(f.GetStatus().String()))
	if f.GetError() != "" {
		msg += ": " + f.GetError()
	}
	k.recorder.Event(kube.NodeRef(f.GetNode()), kind, reason, msg)
	if ref := kube.FenceRef(f.GetId()); ref != nil {
		k.recorder.Event(ref, kind, reason, msg)
	}
	if r := k.rec.Load(); r != nil {
		r.Enqueue(f.GetNode())
	}
}

// secret reads one key of a Secret, in the fence namespace when namespace is empty.
func (k *kubeMode) secret(namespace, name, key string) (string, error) {
	if namespace == "" {
		namespace = k.a.cfg.FenceNamespace
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := namespace + "/" + name + "/" + key
	s, err := k.core.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	k.secretsMu.Lock()
	defer k.secretsMu.Unlock()
	if err != nil {
		// A Secret that is gone or forbidden is gone; an apiserver that does not answer leaves
		// the last value read in force.
		if v, ok := k.secrets[id]; ok && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return v, nil
		}
		delete(k.secrets, id)
		return "", fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	v, ok := s.Data[key]
	if !ok {
		delete(k.secrets, id)
		return "", fmt.Errorf("secret %s/%s has no key %q", namespace, name, key)
	}
	if k.secrets == nil {
		k.secrets = map[string]string{}
	}
	k.secrets[id] = string(v)
	return string(v), nil
}

// needsFencing applies the fencing policy: by default only nodes running stateful pods are fenced.
func (k *kubeMode) needsFencing(ctx context.Context, node string) (bool, string) {
	ok, pods, err := k.writer.NeedsFencing(ctx, node, k.policy)
	if err != nil {
		return true, "" // in doubt, the policy does not hold fencing back; the storm guard did its part
	}
	if !ok {
		return false, fmt.Sprintf("no pod on the node needs fencing under policy %s", k.policy)
	}
	return true, fmt.Sprintf("stateful pods on the node: %s", strings.Join(pods, ", "))
}

package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodefence/nodefence/coordinator/config"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/coordinator/leader"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// kubeMode is the coordinator's Kubernetes side: it reads fence ConfigMaps and Nodes, and applies
// the engine's and the fence flow's decisions through the kube writer — on its own goroutine, so a
// slow apiserver never stalls the engine.
type kubeMode struct {
	a       *App
	core    kubernetes.Interface
	writer  *kube.Writer
	policy  kube.Policy
	actions chan func(context.Context)

	mu       sync.Mutex
	released map[string]bool // fence ids whose node was released
}

// Zone labels, current and legacy, as kube-controller-manager reads them.
var (
	zoneLabels   = []string{corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone}
	regionLabels = []string{corev1.LabelTopologyRegion, corev1.LabelFailureDomainBetaRegion}
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
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	w, err := kube.New(rc, kube.Options{Log: a.log})
	if err != nil {
		return nil, err
	}
	p, err := kube.ParsePolicy(a.cfg.FencePolicy)
	if err != nil {
		return nil, fmt.Errorf("--fence-policy: %w", err)
	}
	return &kubeMode{a: a, core: core, writer: w, policy: p, actions: make(chan func(context.Context), 4096), released: map[string]bool{}}, nil
}

// loadConfig reads the seed's fence ConfigMaps from the namespace.
func (k *kubeMode) loadConfig(ctx context.Context) (*config.Config, error) {
	list, err := k.core.CoreV1().ConfigMaps(k.a.cfg.FenceNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list fence ConfigMaps in %s: %w", k.a.cfg.FenceNamespace, err)
	}
	var cms []config.ConfigMap
	for _, cm := range list.Items {
		if !strings.HasPrefix(cm.Name, config.ConfigPrefix) && !strings.HasPrefix(cm.Name, config.MethodPrefix) {
			continue
		}
		c := config.ConfigMap{Kind: "ConfigMap", Data: cm.Data, Source: "ConfigMap " + cm.Namespace + "/" + cm.Name}
		c.Metadata.Name, c.Metadata.Namespace = cm.Name, cm.Namespace
		cms = append(cms, c)
	}
	c, err := config.FromConfigMaps(cms, k.a.cfg.driverMap())
	if err != nil {
		return nil, err
	}
	return c, c.Validate()
}

// nodeInputs lists the cluster's Nodes as engine inputs with their zones.
func (k *kubeMode) nodeInputs(ctx context.Context, fences *config.Config) ([]engine.Input, error) {
	list, err := k.core.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	now := time.Now()
	var out []engine.Input
	for _, n := range list.Items {
		out = append(out, engine.Configured{Node: n.Name, Region: label(n.Labels, regionLabels), Zone: label(n.Labels, zoneLabels),
			Fenceable: fences.HasNode(n.Name), At: now})
	}
	return out, nil
}

func label(l map[string]string, keys []string) string {
	for _, k := range keys {
		if v := l[k]; v != "" {
			return v
		}
	}
	return ""
}

// run applies queued actions until ctx ends, and reloads the ConfigMaps every 30 s.
func (k *kubeMode) run(ctx context.Context) {
	// Informers on Nodes and on the fence namespace's ConfigMaps wake a reload as soon as something
	// changes; the ticker is the backstop.
	changed := make(chan struct{}, 1)
	k.watch(ctx, changed)
	reload := time.NewTicker(30 * time.Second)
	defer reload.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-k.actions:
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			f(actx)
			cancel()
		case <-changed:
			k.reload(ctx)
		case <-reload.C:
			k.reload(ctx)
		}
	}
}

// watch starts informers whose events signal changed (coalesced: one pending signal at most).
func (k *kubeMode) watch(ctx context.Context, changed chan<- struct{}) {
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(old, cur any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	nodes := informers.NewSharedInformerFactory(k.core, 0)
	if _, err := nodes.Core().V1().Nodes().Informer().AddEventHandler(handler); err != nil {
		k.a.log.Error("node informer", "err", err)
	}
	cms := informers.NewSharedInformerFactoryWithOptions(k.core, 0, informers.WithNamespace(k.a.cfg.FenceNamespace))
	if _, err := cms.Core().V1().ConfigMaps().Informer().AddEventHandler(handler); err != nil {
		k.a.log.Error("configmap informer", "err", err)
	}
	nodes.Start(ctx.Done())
	cms.Start(ctx.Done())
}

// reload re-reads the fence ConfigMaps and the Nodes and hands both to the running engine: new
// Nodes, new zones and nodes that gained or lost a fence configuration reach the engine now, not at
// the next leader change. An invalid configuration is logged and the previous one kept.
func (k *kubeMode) reload(ctx context.Context) {
	c, err := k.loadConfig(ctx)
	if err != nil {
		k.a.log.Error("fence ConfigMaps invalid; keeping the previous configuration", "err", err)
		return
	}
	k.a.fenceCf.Store(c)
	l, err := k.a.Leading(ctx)
	if err != nil {
		return
	}
	inputs, err := k.nodeInputs(ctx, c)
	if err != nil {
		k.a.log.Error("cannot list Nodes", "err", err)
		return
	}
	for _, in := range inputs {
		if err := l.Loop.Step(ctx, in); err != nil {
			return
		}
	}
}

func (k *kubeMode) do(f func(context.Context)) {
	select {
	case k.actions <- f:
	default:
		k.a.log.Error("kubernetes action queue full; dropping an action (the next decision repeats it)")
	}
}

// onReady mirrors the engine's decisions: taints, and the Ready condition of nodes whose readiness
// changed.
func (k *kubeMode) onReady(term *leader.Term, rd engine.Ready) {
	for _, t := range rd.Taints {
		t := t
		k.do(func(ctx context.Context) {
			if err := k.writer.ApplyTaint(ctx, t.Node, t.From, t.To); err != nil {
				k.a.log.Error("taint not applied", "node", t.Node, "to", t.To, "err", err)
			}
		})
	}
	for _, c := range rd.Conditions {
		c := c
		k.do(func(ctx context.Context) {
			cond := corev1.NodeCondition{Type: corev1.NodeConditionType(c.Type), Status: corev1.ConditionStatus(c.Status), Reason: c.Reason, Message: c.Message}
			if err := k.writer.SetConditions(ctx, c.Node, cond); err != nil {
				k.a.log.Error("pressure condition not written", "node", c.Node, "type", c.Type, "err", err)
			}
		})
	}
	for _, w := range rd.Writes {
		if w.Node == nil {
			continue
		}
		r := *w.Node
		k.do(func(ctx context.Context) {
			var err error
			switch r.Readiness {
			case coordv1.Readiness_READINESS_UNKNOWN:
				err = k.writer.MarkNotReady(ctx, r.Name, "NodeStatusUnknown", "nodefence: "+r.Reason, corev1.ConditionUnknown)
			case coordv1.Readiness_READINESS_NOT_READY:
				err = k.writer.MarkNotReady(ctx, r.Name, "KubeletNotReady", r.Reason, corev1.ConditionFalse)
			case coordv1.Readiness_READINESS_READY:
				// Back: lift the out-of-service taint unless a fence of the node is still running.
				if active, aerr := k.a.store.ActiveFence(ctx, r.Name); aerr == nil && active == nil {
					if removed, uerr := k.writer.Unrelease(ctx, r.Name); uerr != nil {
						err = uerr
					} else if removed {
						k.a.audit(term, r.Name, "release", "node back and recovered: out-of-service taint removed")
					}
				}
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				k.a.log.Error("node condition not written", "node", r.Name, "err", err)
			}
		})
	}
}

// onFence mirrors a fence record to its NodeFence object and, once the node is confirmed off,
// releases its stateful pods (out-of-service taint, force deletion, VolumeAttachments) — never
// before.
func (k *kubeMode) onFence(term *leader.Term, f *coordv1.NodeFence) {
	k.do(func(ctx context.Context) {
		if err := k.writer.MirrorFence(ctx, f); err != nil {
			k.a.log.Error("NodeFence object not written", "fence", f.Id, "err", err)
		}
		if f.Action != coordv1.FenceAction_FENCE_ACTION_OFF || f.ConfirmedOffAt == nil || !k.a.proof.dark(f) {
			return // released only once the node was also seen silent (proof.go)
		}
		k.mu.Lock()
		done := k.released[f.Id]
		k.mu.Unlock()
		if done {
			return
		}
		rel, err := k.writer.ReleaseNode(ctx, f.Node)
		if err != nil {
			k.a.log.Error("node not released; retrying with the next record change", "node", f.Node, "fence", f.Id, "err", err)
			return
		}
		k.mu.Lock()
		k.released[f.Id] = true
		k.mu.Unlock()
		k.a.metrics.ObserveStage("release", time.Since(f.ConfirmedOffAt.AsTime()))
		k.a.audit(term, f.Node, "release", fmt.Sprintf("fence %s confirmed off: out-of-service taint; deleted pods %v; deleted volumeattachments %v; kept %v",
			f.Id, rel.DeletedPods, rel.DeletedVolumeAttachments, rel.KeptPods))
	})
}

// secret reads one key of a Secret, in the fence namespace when namespace is empty.
func (k *kubeMode) secret(namespace, name, key string) (string, error) {
	if namespace == "" {
		namespace = k.a.cfg.FenceNamespace
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := k.core.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	v, ok := s.Data[key]
	if !ok {
		return "", fmt.Errorf("secret %s/%s has no key %q", namespace, name, key)
	}
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

package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/cri"
	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/kubepods"
	"github.com/nodefence/nodefence/node-agent/metrics"
	"github.com/nodefence/nodefence/node-agent/pressure"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// grantRelay hands the coordinator's grants to the pressure monitor once it exists; grants before
// that are logged and dropped (there is no candidate they could answer yet).
type grantRelay struct {
	mu  sync.Mutex
	mon *pressure.Monitor
}

func (r *grantRelay) set(m *pressure.Monitor) {
	r.mu.Lock()
	r.mon = m
	r.mu.Unlock()
}

func (r *grantRelay) Grant(g *agentv1.EvictionGrant) {
	r.mu.Lock()
	m := r.mon
	r.mu.Unlock()
	if m == nil {
		slog.Warn("eviction grant before the pressure monitor started; dropped", "signal", g.GetSignal())
		return
	}
	m.Grant(g)
}

// connected tells the monitor about a new coordinator stream, so that it proposes its pending
// candidate again.
func (r *grantRelay) connected() {
	r.mu.Lock()
	m := r.mon
	r.mu.Unlock()
	if m != nil {
		m.Connected()
	}
}

// kubeMode is what Kubernetes mode adds: the node's pods, the local killer (hard thresholds and
// fallbacks), the evictor of granted pods and the shutdown's terminator.
type kubeMode struct {
	client     *kubepods.Client
	source     *kubepods.Source
	killer     *kubepods.Killer
	evictor    *kubepods.Evictor
	terminator *kubepods.Terminator
}

func newKubeMode(opts Config, log *slog.Logger) (*kubeMode, error) {
	var rc *rest.Config
	var err error
	if opts.kubeconfig == "in-cluster" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	cs, err := kubepods.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	cg := kubepods.Cgroups{Root: opts.reader.CgroupRoot, Version: opts.reader.CgroupVersion, Driver: opts.cgroupDriver, KubeletRoot: opts.kubeletCgroupRoot}
	disk := &kubepods.Disk{KubeletRoot: opts.kubeletRootDir, PodLogDir: opts.podLogDir}
	src, err := kubepods.NewSource(cs, opts.agent.NodeName, cg, log, kubepods.WithDisk(disk))
	if err != nil {
		return nil, err
	}
	return &kubeMode{
		client:     cs,
		source:     src,
		killer:     kubepods.NewKiller(cs, opts.agent.NodeName, src, 0, log),
		terminator: kubepods.NewTerminator(cs, kubepods.TerminatorConfig{Log: log}),
	}, nil
}

// wire connects Kubernetes mode to the running agent: granted evictions go through the Eviction
// API and are reported back, hard thresholds kill locally, and with a container runtime the node
// reclaims dead containers and unused images and pods' writable layers count for disk ranking.
func (k *kubeMode) wire(ctx context.Context, opts *Config, a *agent.Agent, met *metrics.Metrics, runtime *cri.Client, log *slog.Logger) {
	k.evictor = kubepods.NewEvictor(k.client, kubepods.EvictorConfig{Log: log, Done: func(c eviction.Candidate, signal string, out kubepods.Outcome, err error) {
		kind, msg := agentv1.EvictionKind_EVICTION_KIND_GRANTED, "evicted through the Eviction API"
		switch {
		case out == kubepods.Gone:
			msg = "the pod was gone already"
		case out != kubepods.Evicted:
			kind, msg = agentv1.EvictionKind_EVICTION_KIND_FAILED, fmt.Sprintf("the Eviction API refused: %v", err)
		}
		a.Send(pressure.EvictionReport(c, signal, kind, msg, time.Now()))
		met.Eviction(signal, kind.String())
	}})
	opts.pressure.Actions = pressure.Actions{Killer: k.killer, Cleanup: k.killer, Granted: k.evictor}
	if runtime != nil {
		opts.pressure.Actions.Node = func(ctx context.Context, containers, images bool) (string, error) {
			r, err := runtime.Reclaim(ctx, containers, images)
			return r.String(), err
		}
		runtime.PodGone, runtime.PodRemoved, runtime.PodLogDir = k.source.PodGone, k.source.PodRemoved, opts.podLogDir
		go detectImages(ctx, runtime, log)
		k.source.SetWritable(func(ctx context.Context) (map[string][2]int64, error) {
			w, err := runtime.Writable(ctx)
			out := make(map[string][2]int64, len(w))
			for uid, u := range w {
				out[uid] = [2]int64{u.Bytes, u.Inodes}
			}
			return out, err
		})
	}
}

// tasks are Kubernetes mode's parts that run with the agent (none when k is nil: standalone).
func (k *kubeMode) tasks() []task {
	if k == nil {
		return nil
	}
	return []task{{"pod source", k.source.Run}, {"evictor", k.evictor.Run}}
}

// detectImages has the runtime client look at the images at start and every cri.DetectPeriod, as
// kubelet's image GC loop does, so that an image's minimum GC age counts from when the node first
// had it.
func detectImages(ctx context.Context, runtime *cri.Client, log *slog.Logger) {
	t := time.NewTicker(cri.DetectPeriod)
	defer t.Stop()
	for {
		if _, err := runtime.DetectImages(ctx); err != nil {
			log.Debug("listing the runtime's images failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

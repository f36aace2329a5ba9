// Package kubescenario is the Kubernetes end-to-end scenario shared by the tests and
// `make bench-recovery`: a real kube-apiserver (testbed/kube), the NodeFence CRD and the coordinator's
// RBAC from deploy/, Nodes in one zone each with an ipmi_sim BMC and a fence configuration in the
// seed's ConfigMap format, StatefulSet pods with PersistentVolumeClaims and VolumeAttachments on the
// victims, the IPMI fence-driver, a coordinator in Kubernetes mode running as its ServiceAccount, and
// one node agent per node — all real, over gRPC and HTTPS on 127.0.0.1.
package kubescenario

import (
	"context"
	"errors"
	"fmt"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/pki"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Options size the scenario.
type Options struct {
	// Healthy and Victims are how many nodes keep reporting and how many may be failed.
	Healthy, Victims int
	// Grace is the node-monitor grace period; FenceTimeout the not-ready time before fencing.
	Grace, FenceTimeout time.Duration
	// HealthyDelay is the coordinator's --release-healthy-delay (default 1 s here).
	HealthyDelay time.Duration
	// PlainPassword puts the BMC password in the fence template instead of a Secret, so a fence
	// needs nothing from the apiserver once its record exists.
	PlainPassword bool
	// FenceMode is the coordinator's --fence-mode (default enforce).
	FenceMode engine.FenceMode
	Log       *slog.Logger
	// UnhealthyConditions are the coordinator's --unhealthy-condition triggers.
	UnhealthyConditions []engine.ConditionTrigger
}

// Env is a running scenario.
type Env struct {
	Opts    Options
	Cluster *kubetest.Cluster
	Admin   *kubernetes.Clientset
	Coord   *app.App
	Nodes   []*Node
	// Proxy stands between the coordinator and the apiserver, to cut it off.
	Proxy *tcpproxy.Proxy
	// PKI issues every component's certificate: the coordinator, the driver, the agents and the
	// operator talk mutual TLS with their own identities.
	PKI   *pki.PKI
	dir   string
	stops []func()
}

// Node is one simulated node.
type Node struct {
	Name   string
	BMC    *ipmisim.BMC
	Victim bool
	Pod    string // the StatefulSet pod on a victim (namespace "apps")
	VA     string // its VolumeAttachment
	// Boot counts the node's boots after the first: its agent reports boot id boot-NAME-BOOT (a
	// machine powered on again has a new one).
	Boot  int
	stop  func()
	agent *agent.Agent
	// stopKubelet stops the kubelet stand-in's Lease renewals.
	stopKubelet func()
}

// DeployDir locates deploy/ from this source file.
func DeployDir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "deploy")
}

// Start builds the whole scenario; Close stops every part of it.
func Start(ctx context.Context, dir string, o Options) (*Env, error) {
	e := &Env{Opts: o, dir: dir}
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		return nil, err
	}
	var err error
	if e.PKI, err = pki.New(filepath.Join(dir, "pki")); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Join(dir, "kube"), 0o700); err != nil {
		return nil, err
	}
	coordCfg, err := e.startAPIServer(ctx, filepath.Join(dir, "kube"))
	if err != nil {
		return nil, err
	}
	driverAddr, err := e.startDriver()
	if err != nil {
		return nil, err
	}
	if _, err := e.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := e.fenceTemplate(ctx); err != nil {
		return nil, err
	}
	if err := e.addNodes(ctx); err != nil {
		return nil, err
	}
	for _, n := range e.Nodes {
		if err := e.startKubelet(ctx, n, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if e.Proxy, err = tcpproxy.Start(strings.TrimPrefix(coordCfg.Host, "https://")); err != nil {
		return nil, err
	}
	e.stops = append(e.stops, e.Proxy.Close)
	coordCfg = rest.CopyConfig(coordCfg)
	coordCfg.Host = "https://" + e.Proxy.Addr()
	if e.Coord, err = e.startCoordinator(ctx, coordCfg, driverAddr); err != nil {
		return nil, err
	}
	for _, n := range e.Nodes {
		if err := e.startAgent(n); err != nil {
			return nil, err
		}
	}
	if err := e.waitConnected(ctx); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// startAPIServer starts kube-apiserver with deploy/'s namespace, CRDs and the coordinator's RBAC,
// and returns the coordinator's ServiceAccount configuration.
func (e *Env) startAPIServer(ctx context.Context, dir string) (*rest.Config, error) {
	c, err := kubetest.New(dir)
	if err != nil {
		return nil, err
	}
	e.Cluster, e.Admin = c, c.Clientset()
	e.stops = append(e.stops, c.Stop)
	a, err := kubetest.NewApplier(c.Config())
	if err != nil {
		return nil, err
	}
	if err := a.ApplyFiles(ctx, DeployDir(), "namespace.yaml", "crd-nodefences.yaml", "crd-nodefenceremediations.yaml", "rbac-coordinator.yaml"); err != nil {
		return nil, err
	}
	for _, r := range []schema.GroupVersionResource{kube.FenceResource, kube.RemediationResource} {
		if err := a.WaitForResource(ctx, r); err != nil {
			return nil, err
		}
	}
	coordCfg, err := c.ServiceAccountConfig(ctx, "nodefence", "nodefence-coordinator")
	if err != nil {
		return nil, err
	}
	return coordCfg, c.WaitForClusterRole(ctx, "nodefence-coordinator", "nodefence", "nodefence-coordinator")
}

// addNodes starts a BMC and creates the Node object for each of the healthy and victim nodes.
func (e *Env) addNodes(ctx context.Context) error {
	o := e.Opts
	for i := 0; i < o.Healthy+o.Victims; i++ {
		n := &Node{Name: fmt.Sprintf("node-%02d", i+1), Victim: i >= o.Healthy}
		var err error
		if n.BMC, err = ipmisim.Start(filepath.Join(e.dir, n.Name), 0, "admin", "password"); err != nil {
			return err
		}
		bmc := n.BMC
		e.stops = append(e.stops, func() { bmc.Stop() })
		if err := e.createNode(ctx, n); err != nil {
			return err
		}
		e.Nodes = append(e.Nodes, n)
	}
	return nil
}

// Dial connects to the coordinator as an operator (spiffe://nodefence/operator/scenario).
// A call refused while an election runs (a loaded machine's etcd can cost the leader its term) is
// asked again, as fencectl does.
func (e *Env) Dial() (*grpc.ClientConn, error) {
	files, err := e.PKI.Files(identity.Operator, "scenario")
	if err != nil {
		return nil, err
	}
	return dial.New(e.Coord.Addr(), files, dial.WaitOutElections(time.Minute))
}

// nodeView asks the coordinator for its view of a node.
func (e *Env) nodeView(ctx context.Context, name string) (*coordv1.Node, error) {
	conn, err := e.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, err := coordv1.NewClusterServiceClient(conn).GetNode(ctx, &coordv1.GetNodeRequest{Node: name})
	return r.GetNode(), err
}

// waitConnected returns once every node's agent is connected and the node Ready.
func (e *Env) waitConnected(ctx context.Context) error {
	conn, err := e.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	cl := coordv1.NewClusterServiceClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, err := cl.ListNodes(ctx, &coordv1.ListNodesRequest{})
		ready := 0
		for _, n := range r.GetNodes() {
			if n.Connected && n.Readiness == coordv1.Readiness_READINESS_READY {
				ready++
			}
		}
		if err == nil && ready == len(e.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d nodes connected and ready (%v)", ready, len(e.Nodes), err)
		}
	}
}

// Close stops everything, newest first.
func (e *Env) Close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
	e.stops = nil
}

func (e *Env) startDriver() (string, error) {
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: filepath.Join(e.dir, "driver"), DefaultTimeout: 10 * time.Second, PollInterval: 20 * time.Millisecond, Log: e.Opts.Log})
	if err != nil {
		return "", err
	}
	files, err := e.PKI.Files(identity.Driver, "ipmi")
	if err != nil {
		return "", err
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: files, DrainTimeout: time.Second}, e.Opts.Log)
	if err != nil {
		return "", err
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go srv.Serve()
	e.stops = append(e.stops, srv.Stop)
	return srv.Addr(), nil
}

// fenceTemplate is the seed's template ConfigMap for the BMCs (fence_ipmilan maps to our ipmi driver),
// with the password in a Secret the coordinator reads at call time.
func (e *Env) fenceTemplate(ctx context.Context) error {
	if _, err := e.Admin.CoreV1().Secrets("nodefence").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bmc-credentials"}, StringData: map[string]string{"password": "password"},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	password := "password_secret=bmc-credentials/password"
	if e.Opts.PlainPassword {
		password = "password=password"
	}
	_, err := e.Admin.CoreV1().ConfigMaps("nodefence").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "fence-method-template-bmc"},
		Data:       map[string]string{"template.properties": "name=bmc\nagent_name=fence_ipmilan\nipaddr=127.0.0.1\nusername=admin\n" + password + "\nlanplus=1\ncipher=3\nmust_sucess=yes\n"},
	}, metav1.CreateOptions{})
	return err
}

func (e *Env) createNode(ctx context.Context, n *Node) error {
	cms := e.Admin.CoreV1().ConfigMaps("nodefence")
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-method-bmc-" + n.Name},
		Data: map[string]string{"method.properties": fmt.Sprintf("template=fence-method-template-bmc\nipport=%d\n", n.BMC.Port)}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fence-config-" + n.Name},
		Data: map[string]string{"config.properties": "node_name=" + n.Name + "\npower_management=bmc\n"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := e.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
		corev1.LabelTopologyZone: "zone-a", corev1.LabelTopologyRegion: "region-1"}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if !n.Victim {
		return nil
	}
	// A StatefulSet member with a PersistentVolumeClaim, attached to the node.
	n.Pod = "db-" + n.Name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: n.Pod, Namespace: "apps", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", UID: types.UID("00000000-0000-0000-0000-00000000d8b0"), Controller: ptr(true)}}},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "db", Image: "db:1"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + n.Pod}}}}},
	}
	if _, err := e.Admin.CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	n.VA = "va-" + n.Name
	pv := "pv-" + n.Name
	_, err := e.Admin.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: n.VA},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: "csi.example.com", NodeName: n.Name, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}, metav1.CreateOptions{})
	return err
}

func ptr[T any](v T) *T { return &v }

func (e *Env) startCoordinator(ctx context.Context, rc *rest.Config, driverAddr string) (*app.App, error) {
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = e.Opts.Grace, 3*e.Opts.Grace
	eng.NodeEvictionRate = 1 // one released node per second: rounds do not wait for the default 10 s token
	eng.Fence.Timeout, eng.Fence.Budget = e.Opts.FenceTimeout, 0
	eng.Fence.Settle = 500 * time.Millisecond
	eng.Fence.Mode = e.Opts.FenceMode
	eng.UnhealthyConditions = e.Opts.UnhealthyConditions
	healthy := e.Opts.HealthyDelay
	if healthy == 0 {
		healthy = time.Second
	}
	coordTLS, err := e.PKI.Files(identity.Coordinator, "scenario")
	if err != nil {
		return nil, err
	}
	cfg := app.Config{
		Server:  server.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second},
		DataDir: filepath.Join(e.dir, "coordinator"), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true,
		KubeREST: rc, FenceNamespace: "nodefence", DriverEndpoints: map[string]string{"ipmi": driverAddr},
		DriverTLS: coordTLS, Engine: eng, ElectionTTL: time.Second, FenceOpTimeout: 10 * time.Second,
		Fencing:                fencing.Policy{Retries: 1, Backoff: 500 * time.Millisecond, IsolationWait: time.Minute, Polls: 3, PollInterval: time.Second},
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: time.Second,
		ReleaseHealthyDelay: healthy,
	}
	a, err := app.New(cfg, e.Opts.Log)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	e.stops = append(e.stops, func() { cancel(); <-done })
	for deadline := time.Now().Add(30 * time.Second); a.Term() == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, errors.New("coordinator did not become leader")
		}
	}
	return a, nil
}

type sampler struct{}

func (sampler) Sample(context.Context) (*agentv1.SignalSample, error) {
	return &agentv1.SignalSample{ObservedAt: timestamppb.Now(), Signals: []*agentv1.Signal{{Name: "memory.available", Available: 8 << 30, Capacity: 16 << 30}}}, nil
}

func (e *Env) startAgent(n *Node) error {
	files, err := e.PKI.Files(identity.Agent, n.Name)
	if err != nil {
		return err
	}
	ag, err := agent.New(agent.Config{Coordinators: []string{e.Coord.Addr()}, TLS: files,
		NodeName: n.Name, BootID: fmt.Sprintf("boot-%s-%d", n.Name, n.Boot), Zone: "zone-a", Region: "region-1", Log: e.Opts.Log}, sampler{})
	if err != nil {
		return err
	}
	n.agent = ag
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ag.Run(ctx) }()
	stopped := false
	n.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	e.stops = append(e.stops, n.stop)
	return nil
}

// AddVictim adds a node while everything runs: its Node object, BMC, fence ConfigMaps, stateful pod
// and agent. The coordinator learns its fence configuration from its informers.
func (e *Env) AddVictim(ctx context.Context, name string) (*Node, error) {
	n := &Node{Name: name, Victim: true}
	var err error
	if n.BMC, err = ipmisim.Start(filepath.Join(e.dir, name), 0, "admin", "password"); err != nil {
		return nil, err
	}
	bmc := n.BMC
	e.stops = append(e.stops, func() { bmc.Stop() })
	if err := e.createNode(ctx, n); err != nil {
		return nil, err
	}
	if err := e.startKubelet(ctx, n, 200*time.Millisecond); err != nil {
		return nil, err
	}
	if err := e.startAgent(n); err != nil {
		return nil, err
	}
	e.Nodes = append(e.Nodes, n)
	return n, nil
}

// Fail makes the node die (its BMC still says on): its agent and its kubelet stop. It returns when.
func (e *Env) Fail(n *Node) time.Time {
	n.stop()
	n.stopKubelet()
	return time.Now()
}

// StopAgent stops only the node's agent: the kubelet keeps renewing its Lease.
func (e *Env) StopAgent(n *Node) time.Time {
	n.stop()
	return time.Now()
}

// StopKubelet stops only the node's kubelet heartbeat: the agent keeps reporting.
func (e *Env) StopKubelet(n *Node) time.Time {
	n.stopKubelet()
	return time.Now()
}

// NodeView asks the coordinator for its view of a node.
func (e *Env) NodeView(ctx context.Context, name string) (*coordv1.Node, error) {
	return e.nodeView(ctx, name)
}

// AnnounceShutdown makes the node's agent report a graceful shutdown (logind's PrepareForShutdown).
func (e *Env) AnnounceShutdown(n *Node) {
	n.agent.Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{
		Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, At: timestamppb.Now()}}})
}

// ReportMemoryPressure makes the node's agent report MemoryPressure=True, as its thresholds would.
func (e *Env) ReportMemoryPressure(n *Node) {
	n.agent.Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
		Type: agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE, Status: agentv1.ConditionStatus_CONDITION_STATUS_TRUE,
		Reason: "KubeletHasInsufficientMemory", Message: "memory.available<100Mi", TransitionTime: timestamppb.Now()}}})
}

// WaitReleased waits until the victim's pod and VolumeAttachment are gone, and returns when the
// pod's deletion was seen.
func (e *Env) WaitReleased(ctx context.Context, n *Node) (time.Time, error) {
	for {
		_, err := e.Admin.CoreV1().Pods("apps").Get(ctx, n.Pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			seen := time.Now()
			for {
				_, err := e.Admin.StorageV1().VolumeAttachments().Get(ctx, n.VA, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return seen, nil
				}
				select {
				case <-ctx.Done():
					return time.Time{}, fmt.Errorf("VolumeAttachment %s of %s never deleted: %w", n.VA, n.Name, ctx.Err())
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("pod %s of %s never released: %w", n.Pod, n.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// HasOutOfServiceTaint reports whether the Node carries node.kubernetes.io/out-of-service.
func (e *Env) HasOutOfServiceTaint(ctx context.Context, n *Node) (bool, error) {
	node, err := e.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, t := range node.Spec.Taints {
		if t.Key == kube.OutOfServiceTaint().Key {
			return true, nil
		}
	}
	return false, nil
}

// TempDir makes a working directory for a scenario outside tests.
func TempDir() (string, func(), error) {
	d, err := os.MkdirTemp("", "nodefence-kube-")
	return d, func() { os.RemoveAll(d) }, err
}

// Fences returns the node's fence records, newest first (errors count as none: callers poll).
func (e *Env) Fences(ctx context.Context, node string) []*coordv1.NodeFence {
	page, err := e.Coord.Store().ListFences(ctx, store.ListOptions{Node: node, Limit: 100})
	if err != nil {
		return nil
	}
	return page.Fences
}

package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// granter is a real AgentService that acks everything and sends one grant after the hello.
type granter struct {
	agentv1.UnimplementedAgentServiceServer
	grant *agentv1.EvictionGrant
}

func (g *granter) Connect(st agentv1.AgentService_ConnectServer) error {
	for first := true; ; first = false {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
		if first {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Grant{Grant: g.grant}}); err != nil {
				return err
			}
		}
	}
}

// TestRunKubernetesModeEvictsGrants runs the binary with --kubeconfig as the agent's
// ServiceAccount (deploy/'s RBAC) against a real apiserver: the coordinator's grant evicts the pod.
func TestRunKubernetesModeEvictsGrants(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := kubetest.NewApplier(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"namespace.yaml", "rbac-node-agent.yaml"} {
		objs, err := kubetest.ReadObjects(filepath.Join("../../../deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if _, err := a.Apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	rc, err := c.ServiceAccountConfig(ctx, "nodefence", "nodefence-node-agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitForClusterRole(ctx, "nodefence-node-agent", "nodefence", "nodefence-node-agent"); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	admin := c.Clientset()
	pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog"},
		Spec:       corev1.PodSpec{NodeName: "node-k1", Containers: []corev1.Container{{Name: "app", Image: "registry.example/hog:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, &granter{grant: &agentv1.EvictionGrant{Signal: "memory.available",
		Pods: []*agentv1.EvictionCandidate{{Namespace: "default", Name: "hog", Uid: string(pod.UID), GracePeriod: durationpb.New(3 * time.Second)}}}})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	rctx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{
			"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=node-k1", "--boot-id-file=" + bootID(t),
			"--proc-root=../../signals/testdata/proc", "--cgroup-root=../../signals/testdata/v1", "--cgroup-version=1",
			"--nodefs-path=" + t.TempDir(), "--kubeconfig=" + kubeconfig,
		}, io.Discard, &stderr)
	}()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("exit %d:\n%s", code, stderr.String())
		}
	}()
	waitUntil(ctx, t, "the granted pod to be Terminating", func() bool {
		p, err := admin.CoreV1().Pods("default").Get(ctx, "hog", metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil && *p.DeletionGracePeriodSeconds == 3
	})
}

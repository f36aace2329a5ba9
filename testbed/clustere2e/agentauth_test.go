package clustere2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// nodeNameExtra is the user extra a node-bound ServiceAccount token carries.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// TestAgentCredentialsOwnNode: each agent runs with a token of deploy/'s node-agent
// ServiceAccount bound to its Node, and deploy/'s admission policy lets those credentials patch
// the status of, and delete, only the pods of that node. A token of the same ServiceAccount
// bound to no node may do neither.
func TestAgentCredentialsOwnNode(t *testing.T) {
	s := start(t, nfcluster.Options{})
	own := s.pod("auth-own", "node-1", nil)
	other := s.pod("auth-other", "node-2", nil)

	agent := s.agentClient("node-1")
	review, err := agent.AuthenticationV1().SelfSubjectReviews().Create(s.ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user := review.Status.UserInfo
	if want := "system:serviceaccount:" + nfcluster.Namespace + ":" + nfcluster.AgentServiceAccount; user.Username != want {
		t.Errorf("node-1's agent authenticates as %q, want %q", user.Username, want)
	}
	if got := user.Extra[nodeNameExtra]; len(got) != 1 || got[0] != "node-1" {
		t.Errorf("node-1's agent token carries %s = %v, want [node-1]", nodeNameExtra, got)
	}

	// What the agent does in an eviction: the status patch and the delete (dry-run: admission
	// runs, nothing is deleted).
	probe := []byte(`{"status":{"conditions":[{"type":"nodefence.io/AuthProbe","status":"True","reason":"Probe"}]}}`)
	patch := func(cs *kubernetes.Clientset, p *corev1.Pod) error {
		_, err := cs.CoreV1().Pods(p.Namespace).Patch(s.ctx, p.Name, types.StrategicMergePatchType, probe, metav1.PatchOptions{}, "status")
		return err
	}
	del := func(cs *kubernetes.Clientset, p *corev1.Pod) error {
		return cs.CoreV1().Pods(p.Namespace).Delete(s.ctx, p.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	if err := patch(agent, own); err != nil {
		t.Errorf("node-1's agent patching the status of its own node's pod: %v", err)
	}
	if err := del(agent, own); err != nil {
		t.Errorf("node-1's agent deleting its own node's pod (dry-run): %v", err)
	}
	for what, err := range map[string]error{"patch pods/status": patch(agent, other), "delete": del(agent, other)} {
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `may not change a pod bound to node "node-2"`) {
			t.Errorf("node-1's agent %s of a pod on node-2: got %v, want Forbidden by the node-agent policy", what, err)
		}
	}
	if got, err := s.admin.CoreV1().Pods(other.Namespace).Get(s.ctx, other.Name, metaGet); err != nil || hasCondition(got, "nodefence.io/AuthProbe") {
		t.Errorf("the pod on node-2 after the refused patch: %v, probe condition %v", err, err == nil && hasCondition(got, "nodefence.io/AuthProbe"))
	}

	// The same ServiceAccount with a token bound to nothing: no node, no pod.
	life := int64(600)
	tr, err := s.admin.CoreV1().ServiceAccounts(nfcluster.Namespace).CreateToken(s.ctx, nfcluster.AgentServiceAccount,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &life}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.RESTConfig(s.c.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	unbound := kubernetes.NewForConfigOrDie(&rest.Config{Host: rc.Host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: rc.CAFile}})
	if err := patch(unbound, own); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs a token bound to its node") {
		t.Errorf("an unbound token of the agents' ServiceAccount patching a pod's status: got %v, want Forbidden by the node-agent policy", err)
	}
}

// agentClient is a clientset with the credentials the node's agent runs with.
func (s *scenario) agentClient(node string) *kubernetes.Clientset {
	s.t.Helper()
	rc, err := cluster.RESTConfig(s.d.AgentKubeconfig(node))
	if err != nil {
		s.t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

// pod creates a busybox pod bound to node running script (default: sleep), with
// terminationGracePeriodSeconds 0 unless mutate changes it, and deletes it when the test ends.
// It does not wait for the pod to run.
func (s *scenario) pod(name, node string, mutate func(*corev1.Pod)) *corev1.Pod {
	s.t.Helper()
	zero := int64(0)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"nodefence.io/test": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "main", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"}}},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	created, err := s.admin.CoreV1().Pods(p.Namespace).Create(s.ctx, p, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			s.t.Errorf("delete pod %s: %v", p.Name, err)
		}
	})
	return created
}

func hasCondition(p *corev1.Pod, typ corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return true
		}
	}
	return false
}

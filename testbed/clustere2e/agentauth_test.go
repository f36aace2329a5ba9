package clustere2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
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
// ServiceAccount bound to its Node. deploy/'s admission policy lets those credentials patch the
// status of, and delete, only the pods of that node; deploy/'s admission webhook (served by the
// coordinators) lets them evict only that node's pods and record Events only about those pods
// and that Node. A token of the same ServiceAccount bound to no node may do none of it.
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

	s.checkAgentReads(agent)
	s.checkAgentEvictions(agent, own, other)
	s.checkAgentEvents(agent, own, other)

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
	// The authorizer's own reason: the apiserver reached the coordinator's webhook and verified
	// its certificate with the nodefence CA (a webhook it cannot reach also denies, without it).
	if _, err := unbound.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-1"}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs a token bound to its node") {
		t.Errorf("an unbound token of the agents' ServiceAccount listing node-1's pods: got %v, want Forbidden by the node-agent authorizer", err)
	}
	if err := evict(s, unbound, own); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs a token bound to its node") {
		t.Errorf("an unbound token of the agents' ServiceAccount evicting a pod: got %v, want Forbidden by the node-agent webhook", err)
	}
}

// checkAgentReads: the agent lists and watches its own node's pods, and neither every pod of the
// cluster nor node-2's (deploy/control-plane/authorization-config.yaml).
func (s *scenario) checkAgentReads(agent *kubernetes.Clientset) {
	t := s.t
	list, err := agent.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-1"})
	if err != nil {
		t.Errorf("node-1's agent listing node-1's pods: %v", err)
	}
	for _, p := range list.Items {
		if p.Spec.NodeName != "node-1" {
			t.Errorf("node-1's agent listed pod %s/%s of %q", p.Namespace, p.Name, p.Spec.NodeName)
		}
	}
	w, err := agent.CoreV1().Pods("").Watch(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-1"})
	if err != nil {
		t.Errorf("node-1's agent watching node-1's pods: %v", err)
	} else {
		w.Stop()
	}
	for what, opts := range map[string]metav1.ListOptions{
		"every pod":          {},
		"node-2's pods":      {FieldSelector: "spec.nodeName=node-2"},
		"pods not on node-1": {FieldSelector: "spec.nodeName!=node-1"},
		"pods by label":      {LabelSelector: "nodefence.io/test"},
	} {
		if _, err := agent.CoreV1().Pods("").List(s.ctx, opts); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may list and watch only the pods of its node") {
			t.Errorf("node-1's agent listing %s: got %v, want Forbidden by the node-agent authorizer (its reason: the apiserver reached it over verified TLS)", what, err)
		}
		if _, err := agent.CoreV1().Pods("default").Watch(s.ctx, opts); !apierrors.IsForbidden(err) {
			t.Errorf("node-1's agent watching %s in a namespace: got %v, want Forbidden by the node-agent authorizer", what, err)
		}
	}
}

// evict asks the Eviction API to evict p (dry-run: admission runs, nothing is evicted).
func evict(s *scenario, cs *kubernetes.Clientset, p *corev1.Pod) error {
	return cs.PolicyV1().Evictions(p.Namespace).Evict(s.ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
}

// checkAgentEvictions: the agent may evict its own node's pod, not node-2's (the webhook looks the
// pod up), nor a pod that does not exist.
func (s *scenario) checkAgentEvictions(agent *kubernetes.Clientset, own, other *corev1.Pod) {
	t := s.t
	if err := evict(s, agent, own); err != nil {
		t.Errorf("node-1's agent evicting its own node's pod (dry-run): %v", err)
	}
	if err := evict(s, agent, other); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `may not act on a pod bound to node "node-2"`) {
		t.Errorf("node-1's agent evicting a pod on node-2: got %v, want Forbidden by the node-agent webhook", err)
	}
	missing := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: "auth-missing"}}
	if err := evict(s, agent, missing); !apierrors.IsForbidden(err) {
		t.Errorf("node-1's agent evicting a pod that does not exist: got %v, want Forbidden by the node-agent webhook", err)
	}
	if p, err := s.admin.CoreV1().Pods(other.Namespace).Get(s.ctx, other.Name, metaGet); err != nil || p.UID != other.UID || p.DeletionTimestamp != nil {
		t.Errorf("the pod on node-2 after the refused eviction: %v", err)
	}
}

// checkAgentEvents: the agent may record Events about its own node's pods and its own Node (both
// Event APIs), not about node-2's pod or node-2, and may not patch an Event.
func (s *scenario) checkAgentEvents(agent *kubernetes.Clientset, own, other *corev1.Pod) {
	t := s.t
	podRef := func(p *corev1.Pod) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	}
	nodeRef := func(n string) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: n}
	}
	now := metav1.Now()
	core := func(about corev1.ObjectReference) (*corev1.Event, error) {
		return agent.CoreV1().Events("default").Create(s.ctx, &corev1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "auth-probe-"}, InvolvedObject: about, Reason: "AuthProbe", Message: "probe",
			Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "nodefence-node-agent", Host: "node-1"},
			FirstTimestamp: now, LastTimestamp: now, Count: 1}, metav1.CreateOptions{})
	}
	series := func(about corev1.ObjectReference) error {
		_, err := agent.EventsV1().Events("default").Create(s.ctx, &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "auth-probe-"}, Regarding: about, Reason: "AuthProbe", Note: "probe",
			Type: corev1.EventTypeNormal, Action: "Probe", EventTime: metav1.NowMicro(),
			ReportingController: "nodefence.io/node-agent", ReportingInstance: "node-1"}, metav1.CreateOptions{})
		return err
	}
	allowed := map[string]corev1.ObjectReference{"its own node's pod": podRef(own), "its own Node": nodeRef("node-1")}
	for what, ref := range allowed {
		ev, err := core(ref)
		if err != nil {
			t.Errorf("node-1's agent recording an Event about %s: %v", what, err)
			continue
		}
		if _, err := agent.CoreV1().Events(ev.Namespace).Patch(s.ctx, ev.Name, types.MergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node-1's agent patching its Event: got %v, want Forbidden (create only)", err)
		}
		if err := series(ref); err != nil {
			t.Errorf("node-1's agent recording an events.k8s.io Event about %s: %v", what, err)
		}
	}
	denied := map[string]corev1.ObjectReference{"a pod on node-2": podRef(other), "node-2": nodeRef("node-2"),
		"a Namespace": {Kind: "Namespace", APIVersion: "v1", Name: nfcluster.Namespace}}
	for what, ref := range denied {
		if _, err := core(ref); !apierrors.IsForbidden(err) {
			t.Errorf("node-1's agent recording an Event about %s: got %v, want Forbidden by the node-agent webhook", what, err)
		}
		if err := series(ref); !apierrors.IsForbidden(err) {
			t.Errorf("node-1's agent recording an events.k8s.io Event about %s: got %v, want Forbidden by the node-agent webhook", what, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.admin.CoreV1().Events("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "reason=AuthProbe"})
	})
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

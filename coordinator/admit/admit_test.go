package admit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

const agentUser = "system:serviceaccount:nodefence:nodefence-node-agent"

func pod(ns, name, uid, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}}
}

func TestJudge(t *testing.T) {
	own, other := pod("default", "a", "u-a", "node-1"), pod("default", "b", "u-b", "node-2")
	for _, tc := range []struct {
		name string
		node string
		obj  Object
		pod  *corev1.Pod
		deny string // "" allowed
	}{
		{"own pod", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "a"}, own, ""},
		{"own pod with uid", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "a", UID: "u-a"}, own, ""},
		{"own node", "node-1", Object{Kind: "Node", Name: "node-1"}, nil, ""},
		{"pod on another node", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "b"}, other, `a pod bound to node "node-2"`},
		{"unscheduled pod", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "b"}, pod("default", "b", "u", ""), `a pod bound to node ""`},
		{"another node", "node-1", Object{Kind: "Node", Name: "node-2"}, nil, `may not act on Node "node-2"`},
		{"no such pod", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "c"}, nil, "no such pod"},
		{"stale uid", "node-1", Object{Kind: "Pod", Namespace: "default", Name: "a", UID: "old"}, own, "uid old is not the pod's"},
		{"another kind", "node-1", Object{Kind: "Deployment", Namespace: "nodefence", Name: "nodefence-fence-driver-ipmi"}, nil, "only on its Node and its node's pods"},
		{"token without node", "", Object{Kind: "Pod", Namespace: "default", Name: "a"}, own, "needs a token bound to its node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Judge(tc.node, tc.obj, tc.pod)
			switch {
			case tc.deny == "" && err != nil:
				t.Errorf("Judge = %v, want allowed", err)
			case tc.deny != "" && (err == nil || !strings.Contains(err.Error(), tc.deny)):
				t.Errorf("Judge = %v, want a refusal saying %q", err, tc.deny)
			}
		})
	}
}

// TestHandler: AdmissionReviews over HTTP, as the apiserver sends them.
func TestHandler(t *testing.T) {
	pods := map[string]*corev1.Pod{"default/a": pod("default", "a", "u-a", "node-1"), "default/b": pod("default", "b", "u-b", "node-2")}
	lookups := 0
	h := &Handler{AgentUser: agentUser, Pods: func(_ context.Context, ns, name string) (*corev1.Pod, error) {
		lookups++
		if ns == "broken" {
			return nil, errors.New("apiserver away")
		}
		return pods[ns+"/"+name], nil
	}}
	srv := httptest.NewTLSServer(h)
	defer srv.Close()

	node1 := authnv1.UserInfo{Username: agentUser, Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"node-1"}}}
	eviction := func(u authnv1.UserInfo, ns, name string) *admissionv1.AdmissionRequest {
		return &admissionv1.AdmissionRequest{UID: "r", UserInfo: u, Operation: admissionv1.Create, Namespace: ns, Name: name,
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, SubResource: "eviction"}
	}
	coreEvent := func(about, related *corev1.ObjectReference) *admissionv1.AdmissionRequest {
		ev := corev1.Event{InvolvedObject: *about, Related: related}
		raw, _ := json.Marshal(ev)
		return &admissionv1.AdmissionRequest{UID: "r", UserInfo: node1, Operation: admissionv1.Create, Namespace: "default",
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "events"}, Object: runtime.RawExtension{Raw: raw}}
	}
	newEvent := func(about corev1.ObjectReference) *admissionv1.AdmissionRequest {
		raw, _ := json.Marshal(eventsv1.Event{Regarding: about})
		return &admissionv1.AdmissionRequest{UID: "r", UserInfo: node1, Operation: admissionv1.Create, Namespace: "default",
			Resource: metav1.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}, Object: runtime.RawExtension{Raw: raw}}
	}
	podRef := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: name}
	}
	for _, tc := range []struct {
		name string
		req  *admissionv1.AdmissionRequest
		deny string
	}{
		{"evict own pod", eviction(node1, "default", "a"), ""},
		{"evict a pod on node-2", eviction(node1, "default", "b"), `bound to node "node-2"`},
		{"evict a missing pod", eviction(node1, "default", "gone"), "no such pod"},
		{"lookup fails", eviction(node1, "broken", "a"), "cannot be checked"},
		{"no node in the token", eviction(authnv1.UserInfo{Username: agentUser}, "default", "a"), "needs a token bound to its node"},
		{"two nodes in the token", eviction(authnv1.UserInfo{Username: agentUser, Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"node-1", "node-2"}}}, "default", "a"), "needs a token bound to its node"},
		{"another user", eviction(authnv1.UserInfo{Username: "system:serviceaccount:kube-system:x"}, "default", "b"), ""},
		{"event about own pod", coreEvent(podRef("a"), nil), ""},
		{"event about node-2's pod", coreEvent(podRef("b"), nil), `bound to node "node-2"`},
		{"event related to node-2's pod", coreEvent(podRef("a"), podRef("b")), `bound to node "node-2"`},
		{"event about own node", coreEvent(&corev1.ObjectReference{Kind: "Node", Name: "node-1"}, nil), ""},
		{"event about node-2", coreEvent(&corev1.ObjectReference{Kind: "Node", Name: "node-2"}, nil), `Node "node-2"`},
		{"event about a Deployment", coreEvent(&corev1.ObjectReference{Kind: "Deployment", Namespace: "default", Name: "d"}, nil), "only on its Node"},
		{"events.k8s.io about own pod", newEvent(*podRef("a")), ""},
		{"events.k8s.io about node-2's pod", newEvent(*podRef("b")), `bound to node "node-2"`},
		{"a resource the rule does not cover", &admissionv1.AdmissionRequest{UID: "r", UserInfo: node1, Operation: admissionv1.Create,
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}}, "through this webhook's rule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: tc.req})
			if resp.UID != tc.req.UID {
				t.Errorf("response uid %q, want the request's %q", resp.UID, tc.req.UID)
			}
			switch {
			case tc.deny == "" && !resp.Allowed:
				t.Errorf("denied (%v), want allowed", resp.Result)
			case tc.deny != "" && (resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, tc.deny)):
				t.Errorf("allowed %v, result %+v; want 403 saying %q", resp.Allowed, resp.Result, tc.deny)
			}
		})
	}
	if lookups == 0 {
		t.Error("no pod was looked up")
	}

	// Not an AdmissionReview, too big, or not a POST: refused without an answer.
	cl := srv.Client()
	for name, do := range map[string]func() (*http.Response, error){
		"GET":     func() (*http.Response, error) { return cl.Get(srv.URL) },
		"garbage": func() (*http.Response, error) { return cl.Post(srv.URL, "application/json", strings.NewReader("{")) },
		"no request": func() (*http.Response, error) {
			return cl.Post(srv.URL, "application/json", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`))
		},
		"2 MiB": func() (*http.Response, error) {
			return cl.Post(srv.URL, "application/json", bytes.NewReader(bytes.Repeat([]byte(" "), 2<<20)))
		},
	} {
		r, err := do()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r.Body.Close()
		if r.StatusCode < 400 {
			t.Errorf("%s: status %d, want an error status", name, r.StatusCode)
		}
	}
}

func post(t *testing.T, srv *httptest.Server, review admissionv1.AdmissionReview) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	r, err := srv.Client().Post(srv.URL+Path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("status %d, decoding the response: %v", r.StatusCode, err)
	}
	return out.Response
}

package admit

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestListOwnNode(t *testing.T) {
	sel := func(op metav1.FieldSelectorOperator, key string, v ...string) *authzv1.FieldSelectorAttributes {
		return &authzv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{{Key: key, Operator: op, Values: v}}}
	}
	pods := func(verb string, fs *authzv1.FieldSelectorAttributes) *authzv1.ResourceAttributes {
		return &authzv1.ResourceAttributes{Verb: verb, Version: "v1", Resource: "pods", FieldSelector: fs}
	}
	for _, tc := range []struct {
		name  string
		node  string
		attrs *authzv1.ResourceAttributes
		deny  string
	}{
		{"list own node", "node-1", pods("list", sel(metav1.FieldSelectorOpIn, "spec.nodeName", "node-1")), ""},
		{"watch own node", "node-1", pods("watch", sel(metav1.FieldSelectorOpIn, "spec.nodeName", "node-1")), ""},
		{"list every pod", "node-1", pods("list", nil), "only the pods of its node"},
		{"watch another node", "node-1", pods("watch", sel(metav1.FieldSelectorOpIn, "spec.nodeName", "node-2")), "only the pods of its node"},
		{"not own node", "node-1", pods("list", sel(metav1.FieldSelectorOpNotIn, "spec.nodeName", "node-1")), "only the pods of its node"},
		{"two values", "node-1", pods("list", sel(metav1.FieldSelectorOpIn, "spec.nodeName", "node-1", "node-2")), "only the pods of its node"},
		{"another field", "node-1", pods("list", sel(metav1.FieldSelectorOpIn, "metadata.name", "node-1")), "only the pods of its node"},
		{"no node", "", pods("list", sel(metav1.FieldSelectorOpIn, "spec.nodeName", "node-1")), "needs a token bound to its node"},
		{"get a pod", "node-1", pods("get", nil), ""},
		{"pods/status", "node-1", &authzv1.ResourceAttributes{Verb: "list", Resource: "pods", Subresource: "status"}, ""},
		{"list nodes", "node-1", &authzv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, ""},
		{"non-resource", "node-1", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ListOwnNode(tc.node, tc.attrs)
			if (tc.deny == "") != (got == "") || !strings.Contains(got, tc.deny) {
				t.Errorf("ListOwnNode = %q, want %q", got, tc.deny)
			}
		})
	}
}

// TestAuthorizeHandler: SubjectAccessReviews as the apiserver's webhook authorizer sends them.
func TestAuthorizeHandler(t *testing.T) {
	srv := httptest.NewTLSServer(&AuthorizeHandler{AgentUser: agentUser})
	defer srv.Close()
	review := func(user string, extra map[string]authzv1.ExtraValue, fs string) authzv1.SubjectAccessReviewStatus {
		t.Helper()
		attrs := &authzv1.ResourceAttributes{Verb: "list", Version: "v1", Resource: "pods"}
		if fs != "" {
			attrs.FieldSelector = &authzv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{{Key: "spec.nodeName", Operator: metav1.FieldSelectorOpIn, Values: []string{fs}}}}
		}
		body, _ := json.Marshal(authzv1.SubjectAccessReview{TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview"},
			Spec: authzv1.SubjectAccessReviewSpec{User: user, Extra: extra, ResourceAttributes: attrs}})
		r, err := srv.Client().Post(srv.URL+AuthorizePath, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var out authzv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&out); err != nil || out.APIVersion != "authorization.k8s.io/v1" {
			t.Fatalf("status %d, decoding: %v (%+v)", r.StatusCode, err, out.TypeMeta)
		}
		return out.Status
	}
	node1 := map[string]authzv1.ExtraValue{NodeNameExtra: {"node-1"}}
	if st := review(agentUser, node1, "node-2"); !st.Denied || st.Allowed || !strings.Contains(st.Reason, "only the pods of its node") {
		t.Errorf("agent of node-1 listing node-2's pods: %+v, want denied", st)
	}
	if st := review(agentUser, node1, "node-1"); st.Denied || st.Allowed {
		t.Errorf("agent of node-1 listing its pods: %+v, want no opinion (RBAC decides)", st)
	}
	if st := review("system:serviceaccount:kube-system:x", nil, ""); st.Denied || st.Allowed {
		t.Errorf("another user listing every pod: %+v, want no opinion", st)
	}
}

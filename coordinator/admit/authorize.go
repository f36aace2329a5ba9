package admit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AuthorizePath is where AuthorizeHandler is served: the authorization webhook of
// deploy/control-plane/authorization-config.yaml.
const AuthorizePath = "/authorize/node-agent"

// ListOwnNode decides a read of the agents' ServiceAccount: a list or watch of pods must select
// the pods of the node its token names (field selector spec.nodeName=<node>); it returns why not,
// or "" when the request is not such a read or selects its node. RBAC ignores field selectors and
// admission never sees a read, so this rule runs as an authorizer, before RBAC (the apiserver
// hands it the request's field selector, KEP-4601, GA since Kubernetes 1.34).
func ListOwnNode(node string, attrs *authzv1.ResourceAttributes) string {
	if attrs == nil || attrs.Group != "" || attrs.Resource != "pods" || attrs.Subresource != "" ||
		(attrs.Verb != "list" && attrs.Verb != "watch") {
		return ""
	}
	if node == "" {
		return "the node agent needs a token bound to its node (no " + NodeNameExtra + ") to list or watch pods"
	}
	if fs := attrs.FieldSelector; fs != nil && slices.ContainsFunc(fs.Requirements, func(r metav1.FieldSelectorRequirement) bool {
		return r.Key == "spec.nodeName" && r.Operator == metav1.FieldSelectorOpIn && len(r.Values) == 1 && r.Values[0] == node
	}) {
		return ""
	}
	return fmt.Sprintf("the node agent of %s may list and watch only the pods of its node (field selector spec.nodeName=%s)", node, node)
}

// AuthorizeHandler answers the apiserver's SubjectAccessReviews for the agents' ServiceAccount:
// denied for a list or watch of pods beyond the agent's node, no opinion on anything else (RBAC
// decides).
type AuthorizeHandler struct {
	// AgentUser is the agents' ServiceAccount user name.
	AgentUser string
}

// ServeHTTP answers one SubjectAccessReview.
func (h *AuthorizeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an authorization.k8s.io/v1 SubjectAccessReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, "the SubjectAccessReview is unreadable or larger than 1 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	var sar authzv1.SubjectAccessReview
	if err := json.Unmarshal(body, &sar); err != nil {
		http.Error(w, "not an authorization.k8s.io/v1 SubjectAccessReview", http.StatusBadRequest)
		return
	}
	var st authzv1.SubjectAccessReviewStatus
	if sar.Spec.User == h.AgentUser {
		var node string
		if v := sar.Spec.Extra[NodeNameExtra]; len(v) == 1 {
			node = v[0]
		}
		if why := ListOwnNode(node, sar.Spec.ResourceAttributes); why != "" {
			st = authzv1.SubjectAccessReviewStatus{Denied: true, Reason: why}
		}
	}
	out, err := json.Marshal(authzv1.SubjectAccessReview{TypeMeta: sar.TypeMeta, Status: st})
	if err != nil {
		http.Error(w, "encoding the response failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// Package admit is the coordinator's validating admission webhook for what the node agents write
// and an admission policy cannot check, because the request does not say which node the object
// belongs to: an Eviction (it names only the pod) and an Event (it names only the object it is
// about). The webhook looks the pod up and admits the request only when the pod is bound to the
// node the caller's token names (the user extra authentication.kubernetes.io/node-name, set by
// the apiserver for a token bound to a Node or to a pod, never by the caller). Everything else
// the agents write (pod deletes, pods/status) is checked in the apiserver itself by
// deploy/policy-node-agent.yaml.
//
// The pure rule is Judge; Handler is its HTTP adapter (admission.k8s.io/v1 AdmissionReview).
package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// Path is where Handler is served (deploy/webhook-node-agent.yaml names it).
	Path = "/validate/node-agent"
	// NodeNameExtra is the user extra of a token bound to a Node (or to a pod, naming its node).
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	// maxBody bounds an AdmissionReview: an Event or an Eviction is a few KiB; the apiserver
	// caps a request object at 3 MiB, which no agent write comes near.
	maxBody = 1 << 20
	// lookupTimeout bounds the pod lookup (the apiserver waits for the webhook 10 s at most).
	lookupTimeout = 5 * time.Second
)

// Object is what a request acts on or is about.
type Object struct {
	Kind, Namespace, Name, UID string
}

func (o Object) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// Judge decides whether the agent of node may evict, or record an Event about, obj. pod is obj
// looked up when obj is a Pod (nil: not found). It returns nil when allowed, else why not.
func Judge(node string, obj Object, pod *corev1.Pod) error {
	switch {
	case node == "":
		return errors.New("the node agent needs a token bound to its node (no " + NodeNameExtra + ")")
	case obj.Kind == "Node":
		if obj.Name != node {
			return fmt.Errorf("the node agent of %s may not act on Node %q", node, obj.Name)
		}
		return nil
	case obj.Kind != "Pod":
		return fmt.Errorf("the node agent of %s may act only on its Node and its node's pods, not on %s", node, obj)
	case pod == nil:
		return fmt.Errorf("the node agent of %s may not act on %s: no such pod", node, obj)
	case obj.UID != "" && string(pod.UID) != obj.UID:
		return fmt.Errorf("the node agent of %s may not act on %s: uid %s is not the pod's", node, obj, obj.UID)
	case pod.Spec.NodeName != node:
		return fmt.Errorf("the node agent of %s may not act on a pod bound to node %q", node, pod.Spec.NodeName)
	}
	return nil
}

// PodGetter looks a pod up; nil, nil when it does not exist. Defined here because the webhook
// reads pods and nothing else.
type PodGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// Handler serves the webhook. Requests of users other than AgentUser are admitted untouched: the
// webhook configuration sends only the agents' requests, and the rule is theirs.
type Handler struct {
	// AgentUser is the agents' ServiceAccount user name
	// (system:serviceaccount:nodefence:nodefence-node-agent).
	AgentUser string
	// Pods looks pods up (the coordinator's clientset).
	Pods PodGetter
	// Log nil means slog.Default().
	Log *slog.Logger
}

// ServeHTTP answers one AdmissionReview.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, "the AdmissionReview is unreadable or larger than 1 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "not an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	resp := h.review(r.Context(), review.Request)
	resp.UID = review.Request.UID
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(w, "encoding the response failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// review decides one request.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.UserInfo.Username != h.AgentUser {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var node string
	if v := req.UserInfo.Extra[NodeNameExtra]; len(v) == 1 {
		node = v[0]
	}
	objs, err := subjects(req)
	if err == nil {
		for _, obj := range objs {
			if err = h.judge(ctx, node, obj); err != nil {
				break
			}
		}
	}
	log := h.log().With("user", req.UserInfo.Username, "node", node, "operation", req.Operation,
		"resource", req.Resource.Resource, "subresource", req.SubResource, "namespace", req.Namespace, "name", req.Name)
	if err != nil {
		log.Warn("node agent request denied", "reason", err.Error())
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure,
			Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: err.Error()}}
	}
	log.Debug("node agent request admitted")
	return &admissionv1.AdmissionResponse{Allowed: true}
}

func (h *Handler) judge(ctx context.Context, node string, obj Object) error {
	var pod *corev1.Pod
	if node != "" && obj.Kind == "Pod" {
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		p, err := h.Pods(lctx, obj.Namespace, obj.Name)
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("looking up %s failed; refused while it cannot be checked", obj)
		}
		pod = p
	}
	return Judge(node, obj, pod)
}

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

// subjects are the objects req acts on or is about: the pod of an Eviction; the object of an
// Event and its related object.
func subjects(req *admissionv1.AdmissionRequest) ([]Object, error) {
	res := req.Resource
	switch {
	case res.Group == "" && res.Resource == "pods" && req.SubResource == "eviction":
		return []Object{{Kind: "Pod", Namespace: req.Namespace, Name: req.Name}}, nil
	case res.Group == "" && res.Resource == "events" && req.SubResource == "":
		var ev corev1.Event
		if err := json.Unmarshal(req.Object.Raw, &ev); err != nil {
			return nil, fmt.Errorf("the Event is unreadable: %v", err)
		}
		return refs(&ev.InvolvedObject, ev.Related), nil
	case res.Group == "events.k8s.io" && res.Resource == "events" && req.SubResource == "":
		var ev eventsv1.Event
		if err := json.Unmarshal(req.Object.Raw, &ev); err != nil {
			return nil, fmt.Errorf("the Event is unreadable: %v", err)
		}
		return refs(&ev.Regarding, ev.Related), nil
	}
	return nil, fmt.Errorf("the node agent may not %s %s through this webhook's rule", req.Operation, resourceName(req))
}

func refs(about, related *corev1.ObjectReference) []Object {
	out := []Object{{Kind: about.Kind, Namespace: about.Namespace, Name: about.Name, UID: string(about.UID)}}
	if related != nil {
		out = append(out, Object{Kind: related.Kind, Namespace: related.Namespace, Name: related.Name, UID: string(related.UID)})
	}
	return out
}

func resourceName(req *admissionv1.AdmissionRequest) string {
	n := req.Resource.Resource
	if req.SubResource != "" {
		n += "/" + req.SubResource
	}
	if req.Resource.Group != "" {
		n += "." + req.Resource.Group
	}
	return n
}

package kubepods

import (
	"context"
	"fmt"

	"encoding/json"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// Client is the agent's Kubernetes client: only the calls it makes — its node's pods (get, list,
// watch, delete, status patch), evictions and events — on REST clients whose scheme knows only
// the meta types (the objects are the agent's own structs, types.go). Why not client-go's clientset: importing k8s.io/client-go/kubernetes
// registers every API group of every typed client at start and pulls in discovery and OpenAPI,
// about 8 MB of the agent's resident memory for calls it never makes (make bench-agent).
type Client struct {
	core   rest.Interface
	policy rest.Interface
}

// The API groups the agent calls.
var (
	coreV1   = schema.GroupVersion{Version: "v1"}
	policyV1 = schema.GroupVersion{Group: "policy", Version: "v1"}
)

// scheme holds only the meta types (Status, DeleteOptions): the objects themselves are the
// agent's own structs (types.go), sent and read as JSON.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, coreV1)
	metav1.AddToGroupVersion(s, policyV1)
	return s
}()

// NewClient returns a Client for cfg (a kubeconfig's or the in-cluster config).
func NewClient(cfg *rest.Config) (*Client, error) {
	codecs := serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(scheme)}
	mk := func(gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion, c.APIPath, c.NegotiatedSerializer = &gv, apiPath, codecs
		if c.UserAgent == "" {
			c.UserAgent = "nodefence-node-agent"
		}
		return rest.RESTClientFor(c)
	}
	core, err := mk(coreV1, "/api")
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	policy, err := mk(policyV1, "/apis")
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Client{core: core, policy: policy}, nil
}

// GetPod reads one pod.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (*Pod, error) {
	var p Pod
	raw, err := c.core.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Raw()
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	return &p, err
}

// listPods lists the pods matching the field selector; rv is the list's resourceVersion.
func (c *Client) listPods(ctx context.Context, fieldSelector string) (*podList, error) {
	raw, err := c.core.Get().Resource("pods").Param("fieldSelector", fieldSelector).Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var l podList
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, fmt.Errorf("decoding the pod list: %w", err)
	}
	return &l, nil
}

// watchPods opens a watch of the pods matching the field selector from resourceVersion rv, ending
// after timeout seconds at the latest. The stream is one JSON watch event after another.
func (c *Client) watchPods(ctx context.Context, fieldSelector, rv string, timeout int64) (io.ReadCloser, error) {
	return c.core.Get().Resource("pods").Param("fieldSelector", fieldSelector).Param("resourceVersion", rv).
		Param("watch", "true").Param("allowWatchBookmarks", "true").
		Param("timeoutSeconds", fmt.Sprint(timeout)).Stream(ctx)
}

// DeletePod deletes one pod with opts.
func (c *Client) DeletePod(ctx context.Context, namespace, name string, opts metav1.DeleteOptions) error {
	return c.core.Delete().Namespace(namespace).Resource("pods").Name(name).Body(&opts).Do(ctx).Error()
}

// PatchPodStatus applies a strategic-merge patch to a pod's status.
func (c *Client) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	return c.core.Patch(types.StrategicMergePatchType).Namespace(namespace).Resource("pods").Name(name).
		SubResource("status").Body(patch).Do(ctx).Error()
}

// CreateEvent records an event.
func (c *Client) CreateEvent(ctx context.Context, ev *Event) error {
	ev.APIVersion, ev.Kind = "v1", "Event"
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return c.core.Post().Namespace(ev.Metadata.Namespace).Resource("events").Body(body).Do(ctx).Error()
}

// Evict asks the Eviction API once (no client-side retries: a refusal with a Retry-After would
// otherwise be retried inside the call, sleeping, instead of queued by the caller).
func (c *Client) Evict(ctx context.Context, ev *Eviction) error {
	ev.APIVersion, ev.Kind = "policy/v1", "Eviction"
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return c.policy.Post().AbsPath("/api/v1", "namespaces", ev.Metadata.Namespace, "pods", ev.Metadata.Name, "eviction").
		Body(body).MaxRetries(0).Do(ctx).Error()
}

package kubepods

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// Client is the agent's Kubernetes client: only the calls it makes — its node's pods (get, list,
// watch, delete, status patch), evictions and events — on REST clients whose scheme knows only
// core/v1 and policy/v1. Why not client-go's clientset: importing k8s.io/client-go/kubernetes
// registers every API group of every typed client at start and pulls in discovery and OpenAPI,
// about 8 MB of the agent's resident memory for calls it never makes (make bench-agent).
type Client struct {
	core   rest.Interface
	policy rest.Interface
}

// scheme holds the only types the agent sends and receives.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // a static registration: fails in every test or never
		}
	}
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
	core, err := mk(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	policy, err := mk(policyv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Client{core: core, policy: policy}, nil
}

// GetPod reads one pod.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var p corev1.Pod
	err := c.core.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(&p)
	return &p, err
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
func (c *Client) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	return c.core.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
}

// Evict asks the Eviction API once (no client-side retries: a refusal with a Retry-After would
// otherwise be retried inside the call, sleeping, instead of queued by the caller).
func (c *Client) Evict(ctx context.Context, ev *policyv1.Eviction) error {
	return c.policy.Post().AbsPath("/api/v1", "namespaces", ev.Namespace, "pods", ev.Name, "eviction").
		Body(ev).MaxRetries(0).Do(ctx).Error()
}

package kubepods

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Client is the agent's Kubernetes client: only the calls it makes — its node's pods (get, list,
// watch, delete, status patch), evictions and events — as JSON over the HTTP client client-go
// builds from the config (its TLS, credentials and auth plugins), reading and writing the agent's
// own structs (types.go). Why not client-go's clientset, or even its REST client: importing
// k8s.io/client-go/kubernetes registers every API group and pulls in discovery and OpenAPI, and
// the typed objects (k8s.io/api) and the REST client's codecs are several MB of the agent's
// resident memory for a handful of fields (make bench-agent).
//
// Like client-go's REST client it waits on a token bucket (the config's QPS and Burst, default 5
// and 10) before each request, and retries a request answered 429 or 5xx with a Retry-After
// header up to 10 times after the delay the server asks for (an eviction: never).
type Client struct {
	http    *http.Client
	base    *url.URL
	agent   string
	limiter flowcontrol.RateLimiter
}

// maxRetries is client-go's default for requests answered with a Retry-After.
const maxRetries = 10

// NewClient returns a Client for cfg (a kubeconfig's or the in-cluster config).
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	if c.UserAgent == "" {
		c.UserAgent = "nodefence-node-agent"
	}
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	base, _, err := rest.DefaultServerUrlFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	qps, burst := c.QPS, c.Burst
	if qps == 0 {
		qps = rest.DefaultQPS
	}
	if burst == 0 {
		burst = rest.DefaultBurst
	}
	limiter := c.RateLimiter
	if limiter == nil && qps > 0 {
		limiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	}
	return &Client{http: hc, base: base, agent: c.UserAgent, limiter: limiter}, nil
}

// request is one call: method, path below the server's, query, body and its content type.
type request struct {
	method, path, contentType string
	query                     url.Values
	body                      []byte
	resource, name            string // for errors without a Status body
	group                     string
	retries                   int
}

// do sends r and returns the response of a 2xx answer (the caller closes its body), or the
// apiserver's error as client-go's REST client returns it (an *apierrors.StatusError).
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	u := *c.base
	u.Path = path.Join(u.Path, r.path)
	u.RawQuery = r.query.Encode()
	for attempt := 0; ; attempt++ {
		if c.limiter != nil {
			if err := c.limiter.Wait(ctx); err != nil {
				return nil, err
			}
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u.String(), bytes.NewReader(r.body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		if r.body != nil {
			req.Header.Set("Content-Type", r.contentType)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		wait, retry := retryAfter(resp)
		if retry && attempt < r.retries {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			continue
		}
		return nil, statusError(resp, body, r)
	}
}

// retryAfter is client-go's checkWait: a 429 or 5xx answer with a Retry-After in seconds.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && (resp.StatusCode < 500 || resp.StatusCode >= 600) {
		return 0, false
	}
	s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

// statusError is the error of a non-2xx answer: its Status when the body is one, else a generic
// error for the code, as client-go's REST client makes them.
func statusError(resp *http.Response, body []byte, r request) error {
	var st metav1.Status
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") &&
		json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Status != metav1.StatusSuccess {
		return &apierrors.StatusError{ErrStatus: st}
	}
	retry := 0
	if s, ok := retryAfter(resp); ok {
		retry = int(s / time.Second)
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 256 {
		msg = msg[:256]
	}
	return apierrors.NewGenericServerResponse(resp.StatusCode, r.method,
		schema.GroupResource{Group: r.group, Resource: r.resource}, r.name, msg, retry, true)
}

// call sends r and decodes a 2xx answer into out (nil: discarded).
func (c *Client) call(ctx context.Context, r request, out any) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding the %s answer: %w", r.resource, err)
	}
	return nil
}

func podPath(namespace, name string, sub ...string) string {
	return path.Join(append([]string{"/api/v1/namespaces", namespace, "pods", name}, sub...)...)
}

// GetPod reads one pod.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (*Pod, error) {
	var p Pod
	err := c.call(ctx, request{method: http.MethodGet, path: podPath(namespace, name), resource: "pods", name: name,
		retries: maxRetries}, &p)
	return &p, err
}

// listPods lists the pods matching the field selector.
func (c *Client) listPods(ctx context.Context, fieldSelector string) (*podList, error) {
	var l podList
	err := c.call(ctx, request{method: http.MethodGet, path: "/api/v1/pods", resource: "pods",
		query: url.Values{"fieldSelector": {fieldSelector}}, retries: maxRetries}, &l)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// watchPods opens a watch of the pods matching the field selector from resourceVersion rv, ending
// after timeout seconds at the latest. The stream is one JSON watch event after another.
func (c *Client) watchPods(ctx context.Context, fieldSelector, rv string, timeout int64) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/api/v1/pods", resource: "pods", retries: maxRetries,
		query: url.Values{"fieldSelector": {fieldSelector}, "resourceVersion": {rv}, "watch": {"true"},
			"allowWatchBookmarks": {"true"}, "timeoutSeconds": {strconv.FormatInt(timeout, 10)}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// DeletePod deletes one pod with opts.
func (c *Client) DeletePod(ctx context.Context, namespace, name string, opts metav1.DeleteOptions) error {
	opts.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}
	body, err := json.Marshal(opts)
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: http.MethodDelete, path: podPath(namespace, name), resource: "pods", name: name,
		body: body, contentType: "application/json", retries: maxRetries}, nil)
}

// PatchPodStatus applies a strategic-merge patch to a pod's status.
func (c *Client) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	return c.call(ctx, request{method: http.MethodPatch, path: podPath(namespace, name, "status"), resource: "pods",
		name: name, body: patch, contentType: "application/strategic-merge-patch+json", retries: maxRetries}, nil)
}

// CreateEvent records an event.
func (c *Client) CreateEvent(ctx context.Context, ev *Event) error {
	ev.APIVersion, ev.Kind = "v1", "Event"
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: http.MethodPost, path: path.Join("/api/v1/namespaces", ev.Metadata.Namespace, "events"),
		resource: "events", body: body, contentType: "application/json", retries: maxRetries}, nil)
}

// Evict asks the Eviction API once (no retries: a refusal with a Retry-After would otherwise be
// retried inside the call, sleeping, instead of queued by the caller).
func (c *Client) Evict(ctx context.Context, ev *Eviction) error {
	ev.APIVersion, ev.Kind = "policy/v1", "Eviction"
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: http.MethodPost, path: podPath(ev.Metadata.Namespace, ev.Metadata.Name, "eviction"),
		resource: "pods", group: "policy", name: ev.Metadata.Name, body: body, contentType: "application/json"}, nil)
}

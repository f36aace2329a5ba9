package kubepods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podStore is the Source's cache of the node's pods by namespace/name, filled by watch: the
// agent's own small reflector in place of client-go's informer (whose machinery and the typed
// objects it needs are most of what the agent would otherwise map, make bench-agent).
type podStore struct {
	mu       sync.RWMutex
	pods     map[string]*Pod
	syncedCh chan struct{} // closed after the first list
	once     sync.Once
}

func newPodStore() podStore {
	return podStore{pods: map[string]*Pod{}, syncedCh: make(chan struct{})}
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// list returns the cached pods (shared: callers must not modify them).
func (st *podStore) list() []*Pod {
	st.mu.RLock()
	defer st.mu.RUnlock()
	out := make([]*Pod, 0, len(st.pods))
	for _, p := range st.pods {
		out = append(out, p)
	}
	return out
}

// get returns the cached pod namespace/name.
func (st *podStore) get(namespace, name string) (*Pod, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	p, ok := st.pods[podKey(namespace, name)]
	return p, ok
}

// replace sets the cache to the pods of a list and marks the store synced.
func (st *podStore) replace(items []Pod) {
	m := make(map[string]*Pod, len(items))
	for i := range items {
		p := &items[i]
		p.ManagedFields = nil // often the largest part of a pod object; never read here
		m[podKey(p.Namespace, p.Name)] = p
	}
	st.mu.Lock()
	st.pods = m
	st.mu.Unlock()
	st.once.Do(func() { close(st.syncedCh) })
}

// put stores or removes one pod.
func (st *podStore) put(p *Pod, deleted bool) {
	p.ManagedFields = nil
	st.mu.Lock()
	defer st.mu.Unlock()
	if deleted {
		delete(st.pods, podKey(p.Namespace, p.Name))
		return
	}
	st.pods[podKey(p.Namespace, p.Name)] = p
}

// Watch pacing, as client-go's reflector: a watch ends after 5 to 10 minutes (spread so that
// agents do not re-watch together) and a failed list or watch is retried after a backoff that
// grows to watchMaxBackoff.
const (
	watchMinTimeout = 5 * time.Minute
	watchMinBackoff = 800 * time.Millisecond
	watchMaxBackoff = 30 * time.Second
)

// watch lists the node's pods, then watches them from the list's resourceVersion, re-watching
// from the last seen one when a watch ends and listing again when the watch fails or the version
// is too old (410 Gone), until ctx is done.
func (s *Source) watch(ctx context.Context) {
	sel := NodeSelector(s.node)
	backoff := watchMinBackoff
	wait := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, watchMaxBackoff)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		l, err := s.client.listPods(ctx, sel)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("listing the node's pods failed; retrying", "error", err)
				wait()
			}
			continue
		}
		s.store.replace(l.Items)
		rv := l.ResourceVersion
		for ctx.Err() == nil {
			timeout := int64((watchMinTimeout + rand.N(watchMinTimeout)).Seconds())
			next, err := s.watchOnce(ctx, sel, rv, timeout)
			if err == nil {
				rv, backoff = next, watchMinBackoff
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
				s.log.Warn("watching the node's pods failed; listing again", "error", err)
				if !wait() {
					return
				}
			}
			break
		}
	}
}

// watchEvent is one event of a watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchOnce runs one watch from rv until the server ends it (then it returns the last
// resourceVersion seen, nil) or it fails.
func (s *Source) watchOnce(ctx context.Context, sel, rv string, timeout int64) (string, error) {
	body, err := s.client.watchPods(ctx, sel, rv, timeout)
	if err != nil {
		return rv, err
	}
	defer func() { _ = body.Close() }()
	dec := json.NewDecoder(body)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return rv, nil
			}
			return rv, fmt.Errorf("reading the pod watch: %w", err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			var p Pod
			if err := json.Unmarshal(ev.Object, &p); err != nil {
				return rv, fmt.Errorf("decoding a pod of the watch: %w", err)
			}
			rv = p.ResourceVersion
			s.store.put(&p, ev.Type == "DELETED")
		case "BOOKMARK":
			var m struct {
				metav1.ObjectMeta `json:"metadata"`
			}
			if err := json.Unmarshal(ev.Object, &m); err != nil {
				return rv, fmt.Errorf("decoding a bookmark of the watch: %w", err)
			}
			rv = m.ResourceVersion
		case "ERROR":
			var st metav1.Status
			if err := json.Unmarshal(ev.Object, &st); err != nil {
				return rv, fmt.Errorf("decoding an error of the watch: %w", err)
			}
			if st.Code == http.StatusGone {
				st.Reason = metav1.StatusReasonGone
			}
			return rv, &apierrors.StatusError{ErrStatus: st}
		default:
			return rv, fmt.Errorf("the pod watch sent an event of unknown type %q", ev.Type)
		}
	}
}

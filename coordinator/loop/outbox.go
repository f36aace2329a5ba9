package loop

import (
	"sync"

	"github.com/nodefence/nodefence/coordinator/engine"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// outboundQueue is how many coordinator -> agent messages wait for one stream.
const outboundQueue = 16

// outbox is the outbound queue of one agent stream. A goroutine sends its messages in order while
// it holds any and ends when it is empty: 10,000 idle streams keep no goroutine (and no stack) for
// the grants they rarely receive.
type outbox struct {
	send func(*agentv1.ConnectResponse) error

	mu      sync.Mutex
	queue   []*agentv1.ConnectResponse
	sending bool // a goroutine is draining queue
	closed  bool // the stream ended or a send failed: nothing more is sent
}

// offer queues m without blocking; false when the queue is full or closed.
func (o *outbox) offer(m *agentv1.ConnectResponse) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || len(o.queue) >= outboundQueue {
		return false
	}
	o.queue = append(o.queue, m)
	if !o.sending {
		o.sending = true
		go o.drain()
	}
	return true
}

// drain sends the queued messages in order until the queue is empty, closed, or a send fails.
func (o *outbox) drain() {
	for {
		o.mu.Lock()
		if o.closed || len(o.queue) == 0 {
			o.queue, o.sending = nil, false
			o.mu.Unlock()
			return
		}
		m := o.queue[0]
		o.queue[0] = nil
		o.queue = o.queue[1:]
		o.mu.Unlock()
		if err := o.send(m); err != nil {
			o.close()
		}
	}
}

// close drops what is queued and refuses what comes; a send under way finishes.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed, o.queue = true, nil
	o.mu.Unlock()
}

// Subscribe opens the outbound queue of node's agent stream: the engine's grants for the node are
// passed to send, in order, from a goroutine that lives only while grants wait (send may block on
// the stream's flow control; the loop never waits for it). A newer stream of the node replaces an
// older one. Call cancel when the stream ends: nothing is sent after it returns but a send under way.
func (l *Loop) Subscribe(node string, send func(*agentv1.ConnectResponse) error) (cancel func()) {
	o := &outbox{send: send}
	l.outMu.Lock()
	if l.out == nil {
		l.out = map[string]*outbox{}
	}
	l.out[node] = o
	l.outMu.Unlock()
	return func() {
		l.outMu.Lock()
		if l.out[node] == o {
			delete(l.out, node)
		}
		l.outMu.Unlock()
		o.close()
	}
}

// deliver queues a grant on its node's stream. With no stream, or a full queue, the grant is lost:
// the engine counts it in flight until its TTL, and the agent, with no grant, falls back to a
// local eviction after its own timeout.
func (l *Loop) deliver(g engine.Grant) {
	msg := &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Grant{Grant: g.Grant}}
	l.outMu.Lock()
	o, ok := l.out[g.Node]
	l.outMu.Unlock()
	sent := ok && o.offer(msg)
	if l.cfg.Metrics != nil {
		l.cfg.Metrics.PodGrants.WithLabelValues(g.Zone).Inc()
	}
	if !sent {
		l.cfg.Log.Warn("eviction grant not delivered: no agent stream or its queue is full", "node", g.Node, "zone", g.Zone)
	}
}

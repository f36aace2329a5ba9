package kit

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/services/fault"
)

// maxRemembered bounds how many completed operations are kept for de-duplication.
const maxRemembered = 4096

// operation is one mutating call, shared by every request carrying its operation_id.
type operation struct {
	// what is the action and device; a reused operation_id must name the same.
	what string
	done chan struct{}
	// resp and err are the result, valid once done is closed.
	resp proto.Message
	err  error
}

// opTable de-duplicates mutating calls by operation_id. Successful operations are remembered (the
// newest maxRemembered); failed ones are forgotten, so retrying an id that failed tries again.
type opTable struct {
	mu    sync.Mutex
	ops   map[string]*operation
	order []string // completed successful ids, oldest first
}

func newOpTable() *opTable { return &opTable{ops: map[string]*operation{}} }

// begin returns the operation for id. owner is true when the caller created it and must run it
// and call finish; otherwise the caller waits on op.done. A reused id naming another action or
// device is an error.
func (t *opTable) begin(id, what string) (op *operation, owner bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if op, ok := t.ops[id]; ok {
		if op.what != what {
			var inv fault.Invalid
			inv.Add("operation_id", "%q was already used for %s, not %s", id, op.what, what)
			return nil, false, inv.Err()
		}
		return op, false, nil
	}
	op = &operation{what: what, done: make(chan struct{})}
	t.ops[id] = op
	return op, true, nil
}

// finish records the result and wakes the waiters.
func (t *opTable) finish(id string, op *operation, resp proto.Message, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	op.resp, op.err = resp, err
	close(op.done)
	if err != nil {
		if t.ops[id] == op {
			delete(t.ops, id)
		}
		return
	}
	t.order = append(t.order, id)
	for len(t.order) > maxRemembered {
		delete(t.ops, t.order[0])
		t.order = t.order[1:]
	}
}

// deviceLocks serialises mutating operations per device key.
type deviceLocks struct {
	mu    sync.Mutex
	locks map[string]*deviceLock
}

type deviceLock struct {
	sem  chan struct{}
	refs int
}

// lock waits for the device's lock or the context's end. The returned func releases it.
func (l *deviceLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*deviceLock{}
	}
	dl := l.locks[key]
	if dl == nil {
		dl = &deviceLock{sem: make(chan struct{}, 1)}
		l.locks[key] = dl
	}
	dl.refs++
	l.mu.Unlock()

	release := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if dl.refs--; dl.refs == 0 {
			delete(l.locks, key)
		}
	}
	select {
	case dl.sem <- struct{}{}:
		return func() { <-dl.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

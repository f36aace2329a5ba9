package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nodefence/nodefence/services/fault"
)

// Pool keeps idle device sessions for reuse, so that a login, an SNMPv3 engine discovery or a TLS
// handshake happens once per device and credentials rather than once per call. An operation takes
// a session with Get (or dials one when there is none), uses it alone, and gives it back with Put:
// a session that failed is closed instead of kept (drop on error). At most MaxIdle sessions are
// kept per key, each for at most IdleTimeout; a session idle longer is closed by its timer, so a
// device never holds a forgotten login. Close closes every idle session and keeps none afterwards.
//
// Keys must identify the connection parameters, secrets included: use SessionKey.
type Pool[S any] struct {
	maxIdle     int
	idleTimeout time.Duration
	closeFn     func(S)

	mu     sync.Mutex
	idle   map[string][]*idleEntry[S]
	closed bool
}

type idleEntry[S any] struct {
	s     S
	timer *time.Timer
}

// NewPool returns a pool keeping at most maxIdle sessions per key for at most idleTimeout; closeFn
// ends a session (logs out, closes its socket). A maxIdle or idleTimeout of zero or less disables
// reuse: every session given back is closed.
func NewPool[S any](maxIdle int, idleTimeout time.Duration, closeFn func(S)) *Pool[S] {
	return &Pool[S]{maxIdle: maxIdle, idleTimeout: idleTimeout, closeFn: closeFn, idle: map[string][]*idleEntry[S]{}}
}

// Get takes the most recently used idle session of key; ok is false when there is none.
func (p *Pool[S]) Get(key string) (s S, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[key]
	for len(l) > 0 {
		e := l[len(l)-1]
		l = l[:len(l)-1]
		if len(l) == 0 {
			delete(p.idle, key)
		} else {
			p.idle[key] = l
		}
		if e.timer.Stop() { // a fired timer owns (and closes) its session
			return e.s, true
		}
	}
	return s, false
}

// Put gives a session back after use. A healthy session is kept for reuse while there is room; a
// session that failed (healthy false), one beyond MaxIdle and any given back after Close is closed.
func (p *Pool[S]) Put(key string, s S, healthy bool) {
	p.mu.Lock()
	if !healthy || p.closed || p.maxIdle <= 0 || p.idleTimeout <= 0 || len(p.idle[key]) >= p.maxIdle {
		p.mu.Unlock()
		p.closeFn(s)
		return
	}
	e := &idleEntry[S]{s: s}
	e.timer = time.AfterFunc(p.idleTimeout, func() { p.expire(key, e) })
	p.idle[key] = append(p.idle[key], e)
	p.mu.Unlock()
}

// expire closes a session whose idle timeout passed.
func (p *Pool[S]) expire(key string, e *idleEntry[S]) {
	p.mu.Lock()
	if l := slices.DeleteFunc(p.idle[key], func(x *idleEntry[S]) bool { return x == e }); len(l) == 0 {
		delete(p.idle, key)
	} else {
		p.idle[key] = l
	}
	p.mu.Unlock()
	p.closeFn(e.s)
}

// Idle is the number of idle sessions kept, over all keys.
func (p *Pool[S]) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.idle {
		n += len(l)
	}
	return n
}

// Close closes every idle session; sessions given back later are closed too.
func (p *Pool[S]) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = map[string][]*idleEntry[S]{}
	p.closed = true
	p.mu.Unlock()
	for _, l := range idle {
		for _, e := range l {
			if e.timer.Stop() {
				p.closeFn(e.s)
			}
		}
	}
}

// SessionKey hashes connection parameters, secrets included, into a pool key: the secrets stay in
// memory only in their hashed form.
func SessionKey(parts ...any) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%v\x00", p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Use runs fn with an idle session of key, or with a new one from dial, and gives the session
// back: kept for reuse when fn succeeded or failed only because the target is bad (a
// fault.Invalid or fault.FieldError says nothing about the session), closed otherwise.
func (p *Pool[S]) Use(key string, dial func() (S, error), fn func(S) error) error {
	s, ok := p.Get(key)
	if !ok {
		var err error
		if s, err = dial(); err != nil {
			return err
		}
	}
	err := fn(s)
	var inv fault.Invalid
	var fe fault.FieldError
	p.Put(key, s, err == nil || errors.As(err, &inv) || errors.As(err, &fe))
	return err
}

// Package tcpproxy is a TCP proxy for tests that cut a client off from a real server (an apiserver
// outage, a partition) without touching the server or the network.
package tcpproxy

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of a server: Cut makes the server unreachable
// through it (open connections closed, new ones refused) until Restore.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	// delaying proxies (StartDelayed) hold every chunk a client sends for a delay drawn from
	// [minDelay, maxDelay], in order.
	delaying           bool
	minDelay, maxDelay time.Duration
}

// Start proxies a free 127.0.0.1 port to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

// StartDelayed proxies listen (host:port; port 0 picks one) to target, and can delay what clients
// send (SetDelay): a slow server as its clients see it.
func StartDelayed(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}, delaying: true}
	go p.serve()
	return p, nil
}

// SetDelay makes a delaying proxy hold every chunk a client sends, on open connections too, for a
// delay drawn uniformly from [lo, hi] before the server gets it; order is kept (a chunk never
// overtakes an earlier one). 0, 0 passes chunks on at once.
func (p *Proxy) SetDelay(lo, hi time.Duration) {
	p.mu.Lock()
	p.minDelay, p.maxDelay = lo, max(lo, hi)
	p.mu.Unlock()
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.maxDelay <= p.minDelay {
		return p.minDelay
	}
	return p.minDelay + rand.N(p.maxDelay-p.minDelay)
}

// maxHeld bounds the chunks a delaying proxy holds per connection; a client that sends more
// waits (as it would on a slow server's full window).
const maxHeld = 256

// delayCopy copies src to dst, each chunk held for p.delay() after it was read.
func (p *Proxy) delayCopy(dst io.Writer, src io.Reader) {
	type chunk struct {
		data []byte
		at   time.Time
	}
	held := make(chan chunk, maxHeld)
	go func() {
		defer close(held)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				at := time.Now().Add(p.delay())
				if at.Before(last) {
					at = last
				}
				last = at
				held <- chunk{buf[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range held {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.data); err != nil {
			go func() { // the reader ends when its connection is closed (pipe closes both)
				for range held {
				}
			}()
			return
		}
	}
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		go p.pipe(c)
	}
}

func (p *Proxy) pipe(c net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	u, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = true, true
	p.mu.Unlock()
	go func() {
		if p.delaying {
			p.delayCopy(u, c)
		} else {
			_, _ = io.Copy(u, c)
		}
		u.Close()
	}()
	_, _ = io.Copy(c, u)
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// Cut makes the server unreachable through the proxy.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Retarget sends new connections to target from now on (a server restarted elsewhere, as a
// restarted pod behind its Service); open connections are left as they are.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Cut()
}

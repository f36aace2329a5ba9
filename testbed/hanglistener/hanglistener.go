// Package hanglistener wraps a net.Listener so a simulated device can hang: while hanging, accepted
// connections are held open and never handed to the server (reads are drained so the peer's writes
// succeed), which is what a wedged BMC or API endpoint looks like to a client.
package hanglistener

import (
	"io"
	"net"
	"sync"
)

// Listener is a net.Listener that can hang.
type Listener struct {
	net.Listener
	mu   sync.Mutex
	hang bool
	hung []net.Conn
}

// New wraps ln.
func New(ln net.Listener) *Listener { return &Listener{Listener: ln} }

// SetHang makes new connections hang (true) or be served again (false).
func (l *Listener) SetHang(hang bool) {
	l.mu.Lock()
	l.hang = hang
	l.mu.Unlock()
}

// Accept returns the next connection that is not held.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		hang := l.hang
		if hang {
			l.hung = append(l.hung, c)
		}
		l.mu.Unlock()
		if !hang {
			return c, nil
		}
		go func() { _, _ = io.Copy(io.Discard, c) }()
	}
}

// CloseHung closes the held connections.
func (l *Listener) CloseHung() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.hung {
		c.Close()
	}
	l.hung = nil
}

package brocadesim

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
)

// Telnet protocol bytes (RFC 854).
const (
	iac  = 255
	dont = 254
	do   = 253
	wont = 252
	will = 251
	sb   = 250
	se   = 240

	optTTYPE = 24
)

// telnetReader strips telnet commands from a connection's input and refuses every option the
// client offers or asks for (once per option and verb), so the client stays in plain NVT mode.
type telnetReader struct {
	r        *bufio.Reader
	w        io.Writer
	mu       *sync.Mutex // serialises writes with the shell's output
	answered map[[2]byte]bool
}

func (t *telnetReader) ReadByte() (byte, error) {
	for {
		c, err := t.r.ReadByte()
		if err != nil {
			return 0, err
		}
		if c != iac {
			return c, nil
		}
		verb, err := t.r.ReadByte()
		if err != nil {
			return 0, err
		}
		switch verb {
		case iac:
			return iac, nil
		case do, dont, will, wont:
			opt, err := t.r.ReadByte()
			if err != nil {
				return 0, err
			}
			t.refuse(verb, opt)
		case sb:
			if err := t.skipSubnegotiation(); err != nil {
				return 0, err
			}
		default: // NOP, GA, AYT ...: ignored
		}
	}
}

func (t *telnetReader) refuse(verb, opt byte) {
	var reply byte
	switch verb {
	case do:
		reply = wont
	case will:
		reply = dont
	default:
		return // DONT and WONT need no answer once refused
	}
	key := [2]byte{verb, opt}
	if t.answered[key] {
		return
	}
	t.answered[key] = true
	t.mu.Lock()
	_, _ = t.w.Write([]byte{iac, reply, opt})
	t.mu.Unlock()
}

func (t *telnetReader) skipSubnegotiation() error {
	for {
		c, err := t.r.ReadByte()
		if err != nil {
			return err
		}
		if c != iac {
			continue
		}
		c, err = t.r.ReadByte()
		if err != nil {
			return err
		}
		if c == se {
			return nil
		}
	}
}

// lockedWriter serialises writes to a connection.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Data 0xFF must be doubled on a telnet stream; the shell only writes ASCII.
	return l.w.Write(p)
}

// serveTelnet runs one telnet connection: negotiation, login (three tries), then the shell.
func (s *Switch) serveTelnet(c net.Conn) {
	mu := &sync.Mutex{}
	w := lockedWriter{mu: mu, w: c}
	tr := &telnetReader{r: bufio.NewReader(c), w: c, mu: mu, answered: map[[2]byte]bool{}}
	// The switch never offers WILL ECHO: the client echoes locally, the switch echoes nothing.
	l := &liner{r: tr, w: w}
	// Like Fabric OS's telnetd, ask for the terminal type; a client may refuse.
	if _, err := w.Write([]byte{iac, do, optTTYPE}); err != nil {
		return
	}
	for range 3 {
		if _, err := io.WriteString(w, "\r\n"+s.cfg.Name+" login: "); err != nil {
			return
		}
		user, err := l.readLine()
		if err != nil {
			return
		}
		if _, err := io.WriteString(w, "Password: "); err != nil {
			return
		}
		password, err := l.readLine()
		if err != nil {
			return
		}
		if s.credentialsOK(strings.TrimSpace(user), password) {
			s.shell(strings.TrimSpace(user), w, l)
			return
		}
		if _, err := io.WriteString(w, "\r\nLogin incorrect\r\n"); err != nil {
			return
		}
	}
}

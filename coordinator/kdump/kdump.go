// Package kdump receives fence_kdump_send messages: a node that crashed into its kdump kernel sends
// an 8-byte UDP datagram (magic 0x1B302A40, version 1, host byte order) every few seconds while it
// dumps. The source address names the node. A dumping node is down: its workloads are not running.
package kdump

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Magic and Version of a fence_kdump message.
const (
	Magic   = 0x1B302A40
	Version = 1
)

// Parse checks a datagram. Senders write host byte order; both orders are accepted so that
// big-endian hosts (s390x, ppc64) are recognised too.
func Parse(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("kdump message of %d bytes, want 8", len(b))
	}
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		if order.Uint32(b[0:4]) != Magic {
			continue
		}
		if v := order.Uint32(b[4:8]); v != Version {
			return fmt.Errorf("kdump message version %d, want %d", v, Version)
		}
		return nil
	}
	return fmt.Errorf("kdump message with invalid magic %#x", binary.LittleEndian.Uint32(b[0:4]))
}

// Listener receives kdump messages on one UDP socket.
type Listener struct {
	conn *net.UDPConn
	// Resolve maps a source address to a node name; ok=false discards the message.
	Resolve func(netip.Addr) (node string, ok bool)
	// Seen is called for every valid message of a known node.
	Seen func(node string, from netip.Addr, at time.Time)
	Log  *slog.Logger
}

// Listen binds addr (host:port, UDP).
func Listen(addr string) (*Listener, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("--kdump-listen %s: %w", addr, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("--kdump-listen %s: %w", addr, err)
	}
	return &Listener{conn: c}, nil
}

// Addr is the bound address.
func (l *Listener) Addr() string { return l.conn.LocalAddr().String() }

// Run reads messages until ctx ends.
func (l *Listener) Run(ctx context.Context) error {
	go func() { <-ctx.Done(); l.conn.Close() }()
	buf := make([]byte, 64)
	for {
		n, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		src := from.Addr().Unmap()
		if err := Parse(buf[:n]); err != nil {
			l.Log.Warn("discarding kdump message", "from", src, "err", err)
			continue
		}
		node, ok := l.Resolve(src)
		if !ok {
			l.Log.Warn("discarding kdump message from an unknown address", "from", src)
			continue
		}
		l.Seen(node, src, time.Now())
	}
}

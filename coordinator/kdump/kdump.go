// Package kdump receives fence_kdump_send messages: a node that crashed into its kdump kernel sends
// an 8-byte UDP datagram (magic 0x1B302A40, version 1, host byte order) every few seconds while it
// dumps. The source address names the node. The datagram is unauthenticated: it is evidence that a
// node is dumping, never proof that it is off, and it is dropped for a node that is reaching us (a
// witness heard within the grace period, whether its agent's stream is open or between two streams).
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

	"github.com/prometheus/client_golang/prometheus"
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

// Why a message was dropped, or "accepted": the values of the result label.
const (
	Accepted      = "accepted"
	Malformed     = "malformed"
	UnknownSource = "unknown_source"
	RateLimited   = "rate_limited"
	LiveWitness   = "live_witness"
)

var results = []string{Accepted, Malformed, UnknownSource, RateLimited, LiveWitness}

// NewMessageCounter registers nodefence_kdump_messages_total, by result, on reg.
func NewMessageCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_kdump_messages_total",
		Help: "fence_kdump datagrams received, by result: accepted, or why they were dropped."}, []string{"result"})
	for _, r := range results {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return c
}

// Limits bound the messages the listener passes on. fence_kdump_send sends one message every 10 s
// by default; anything much faster is a flood or a spoof.
type Limits struct {
	// PerSource and PerSourceBurst: messages per second, and burst, from one node's address.
	PerSource      float64
	PerSourceBurst int
	// Global and GlobalBurst: messages per second, and burst, over all sources, checked before
	// anything else is done with a datagram.
	Global      float64
	GlobalBurst int
}

// DefaultLimits allow a node 1 message a second (burst 3) and the listener 50 a second (burst 100).
func DefaultLimits() Limits {
	return Limits{PerSource: 1, PerSourceBurst: 3, Global: 50, GlobalBurst: 100}
}

// Bucket is a token bucket; time is a value passed in.
type Bucket struct {
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

// NewBucket is a full bucket of burst tokens refilled at rate per second.
func NewBucket(rate float64, burst int) *Bucket {
	return &Bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// Take spends one token if there is one at now.
func (b *Bucket) Take(now time.Time) bool {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	if now.After(b.last) {
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Listener receives kdump messages on one UDP socket. Messages are evidence that a node is
// dumping, never proof that it is off: the listener only passes them on, rate-limited, for nodes
// whose agent is silent.
type Listener struct {
	conn *net.UDPConn
	// Resolve maps a source address to a node name; ok=false discards the message.
	Resolve func(netip.Addr) (node string, ok bool)
	// Live reports whether the node is reaching us (the coordinator asks its engine: a witness heard
	// within the grace period, connected or between two streams); a kdump message for such a node
	// is spoofed or stale and is dropped. nil: no node is live.
	Live func(node string) bool
	// Seen is called for every accepted message.
	Seen func(node string, from netip.Addr, at time.Time)
	// Now is the clock messages are stamped and rate-limited with; nil means time.Now.
	Now func() time.Time
	Log *slog.Logger
	// Limits bound the accepted rate; zero values take DefaultLimits.
	Limits Limits
	// Messages counts datagrams by result (NewMessageCounter); nil counts nothing.
	Messages *prometheus.CounterVec

	global    *Bucket
	perSource map[netip.Addr]*Bucket
	dropped   map[string]int // since the last summary line
	lastLog   time.Time
}

// logEvery is the most often the listener logs dropped messages: one summary line per interval,
// never one line per datagram.
const logEvery = time.Minute

// Listen binds addr, an explicit IP address and UDP port: the listener is off unless asked for,
// and never listens on every interface.
func Listen(addr string) (*Listener, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--kdump-listen %q: want IP:PORT of the address fence_kdump_send reaches: %w", addr, err)
	}
	if ap.Addr().IsUnspecified() {
		return nil, fmt.Errorf("--kdump-listen %s: listens on every interface; name the address fence_kdump_send reaches", addr)
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
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
	if l.Limits == (Limits{}) {
		l.Limits = DefaultLimits()
	}
	l.global = NewBucket(l.Limits.Global, l.Limits.GlobalBurst)
	l.perSource = map[netip.Addr]*Bucket{}
	buf := make([]byte, 64)
	clock := l.Now
	if clock == nil {
		clock = time.Now
	}
	for {
		n, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		now := clock()
		src := from.Addr().Unmap()
		node, result := l.judge(buf[:n], src, now)
		l.count(result, src, now)
		if result == Accepted {
			l.Seen(node, src, now)
		}
	}
}

// judge decides what happens to one datagram: cheap checks first, so a flood costs little.
func (l *Listener) judge(b []byte, src netip.Addr, now time.Time) (string, string) {
	if !l.global.Take(now) {
		return "", RateLimited
	}
	if Parse(b) != nil {
		return "", Malformed
	}
	node, ok := l.Resolve(src)
	if !ok {
		return "", UnknownSource
	}
	// Only configured node addresses get a bucket, so the map is bounded by the configuration.
	bk := l.perSource[src]
	if bk == nil {
		bk = NewBucket(l.Limits.PerSource, l.Limits.PerSourceBurst)
		l.perSource[src] = bk
	}
	if !bk.Take(now) {
		return node, RateLimited
	}
	if l.Live != nil && l.Live(node) {
		return node, LiveWitness
	}
	return node, Accepted
}

// count records the result in the metric and, for drops, in at most one log line per logEvery.
func (l *Listener) count(result string, src netip.Addr, now time.Time) {
	if l.Messages != nil {
		l.Messages.WithLabelValues(result).Inc()
	}
	if result == Accepted || l.Log == nil {
		return
	}
	if l.dropped == nil {
		l.dropped = map[string]int{}
	}
	l.dropped[result]++
	if now.Sub(l.lastLog) < logEvery {
		return
	}
	args := []any{"last_from", src, "since", l.lastLog}
	if l.lastLog.IsZero() {
		args = args[:2]
	}
	for _, r := range results {
		if n := l.dropped[r]; n > 0 {
			args = append(args, r, n)
		}
	}
	l.Log.Warn("dropped fence_kdump messages (counted in nodefence_kdump_messages_total; next summary in at most a minute)", args...)
	l.dropped, l.lastLog = map[string]int{}, now
}

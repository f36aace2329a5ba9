package kdump

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/testbed/syncbuf"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"little endian v1 (x86 fence_kdump_send)", []byte{0x40, 0x2a, 0x30, 0x1b, 1, 0, 0, 0}, true},
		{"big endian v1", []byte{0x1b, 0x30, 0x2a, 0x40, 0, 0, 0, 1}, true},
		{"version 2", []byte{0x40, 0x2a, 0x30, 0x1b, 2, 0, 0, 0}, false},
		{"bad magic", []byte{1, 2, 3, 4, 1, 0, 0, 0}, false},
		{"short", []byte{0x40, 0x2a, 0x30}, false},
		{"long", []byte{0x40, 0x2a, 0x30, 0x1b, 1, 0, 0, 0, 0}, false},
	} {
		if err := Parse(tc.b); (err == nil) != tc.ok {
			t.Errorf("%s: Parse = %v", tc.name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte{0x40, 0x2a, 0x30, 0x1b, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) { _ = Parse(b) })
}

// The real fence_kdump_send (Debian fence-agents) is recognised; its source address names the node.
func TestRealFenceKdumpSend(t *testing.T) {
	sender := "/usr/libexec/fence-agents/fence_kdump_send"
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 4)
	l.Log = slog.New(slog.DiscardHandler)
	l.Resolve = func(a netip.Addr) (string, bool) {
		return map[netip.Addr]string{netip.MustParseAddr("127.0.0.1"): "node-1"}[a], a.IsLoopback()
	}
	l.Seen = func(node string, _ netip.Addr, _ time.Time) { seen <- node }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go l.Run(ctx)
	_, p, _ := net.SplitHostPort(l.Addr())
	out, err := exec.CommandContext(ctx, sender, "-p", p, "-c", "2", "-i", "1", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", sender, err, out)
	}
	for i := 0; i < 2; i++ {
		select {
		case n := <-seen:
			if n != "node-1" {
				t.Fatalf("message attributed to %q", n)
			}
		case <-ctx.Done():
			t.Fatalf("message %d from fence_kdump_send not received", i+1)
		}
	}
}

func TestListenNeedsAnExplicitAddress(t *testing.T) {
	for _, addr := range []string{":7410", "0.0.0.0:7410", "[::]:7410", "localhost:7410", "127.0.0.1", ""} {
		if l, err := Listen(addr); err == nil {
			l.conn.Close()
			t.Errorf("Listen(%q) accepted", addr)
		} else if !strings.Contains(err.Error(), "--kdump-listen") {
			t.Errorf("Listen(%q): %v does not name the flag", addr, err)
		}
	}
}

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBucket(1, 3)
	var got []bool
	for _, at := range []time.Duration{0, 0, 0, 0, 500 * time.Millisecond, time.Second, 1100 * time.Millisecond, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second} {
		got = append(got, b.Take(t0.Add(at)))
	}
	want := []bool{true, true, true, false, false, true, false, true, true, true, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("takes = %v, want %v", got, want)
		}
	}
	if b.Take(t0) { // a clock step back refills nothing
		t.Fatal("token after the clock went back")
	}
}

// harness runs a listener on 127.0.0.1 that knows 127.0.0.1 as node-1; it returns the listener,
// its log, the accepted nodes and a UDP sender.
func harness(t *testing.T, live bool, limits Limits) (*Listener, *syncbuf.Buffer, chan string, *net.UDPConn, *prometheus.Registry) {
	t.Helper()
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	seen := make(chan string, 10000)
	l.Log = slog.New(slog.NewTextHandler(logs, nil))
	l.Resolve = func(a netip.Addr) (string, bool) {
		return "node-1", a == netip.MustParseAddr("127.0.0.1")
	}
	l.Live = func(string) bool { return live }
	l.Seen = func(node string, _ netip.Addr, _ time.Time) { seen <- node }
	l.Limits = limits
	reg := prometheus.NewRegistry()
	l.Messages = NewMessageCounter(reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(l.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return l, logs, seen, c, reg
}

// waitCounted polls until the listener has counted n datagrams.
func waitCounted(t *testing.T, reg *prometheus.Registry, n int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, total := map[string]int{}, 0
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				v := int(m.GetCounter().GetValue())
				got[m.GetLabel()[0].GetValue()], total = v, total+v
			}
		}
		if total >= n || time.Now().After(deadline) {
			if total != n {
				t.Fatalf("counted %d datagrams, sent %d: %v", total, n, got)
			}
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var valid = []byte{0x40, 0x2a, 0x30, 0x1b, 1, 0, 0, 0}

// 2,000 junk datagrams are counted in the metric and give at most one log line (the issue saw
// 1,858 WARN lines).
func TestJunkIsCountedNotLogged(t *testing.T) {
	_, logs, seen, c, reg := harness(t, false, Limits{PerSource: 1, PerSourceBurst: 3, Global: 1e6, GlobalBurst: 1e6})
	const n = 2000
	for i := range n {
		junk := []byte{byte(i), 2, 3, 4, 5, 6, 7, 8}
		if i%2 == 1 {
			junk = junk[:i%7]
		}
		if _, err := c.Write(junk); err != nil {
			t.Fatal(err)
		}
		if (i+1)%100 == 0 {
			// Stay under the socket's receive buffer whatever the machine's load: let the listener
			// count each hundred before sending the next.
			waitCounted(t, reg, i+1)
		}
	}
	got := waitCounted(t, reg, n)
	if got[Malformed] != n {
		t.Fatalf("results %v, want %d malformed", got, n)
	}
	if lines := strings.Count(logs.String(), "\n"); lines > 1 {
		t.Fatalf("%d log lines for %d junk datagrams:\n%s", lines, n, logs.String())
	}
	if len(seen) != 0 {
		t.Fatal("junk passed on")
	}
}

// A flood of valid messages from one node passes the per-source burst and no more; a flood over
// all sources is cut by the global limit before any other work.
func TestRateLimits(t *testing.T) {
	t.Run("per source", func(t *testing.T) {
		_, _, seen, c, reg := harness(t, false, Limits{PerSource: 0.001, PerSourceBurst: 3, Global: 1e6, GlobalBurst: 1e6})
		for range 50 {
			c.Write(valid)
		}
		got := waitCounted(t, reg, 50)
		if got[Accepted] != 3 || got[RateLimited] != 47 || len(seen) != 3 {
			t.Fatalf("results %v, %d passed on; want 3 accepted", got, len(seen))
		}
	})
	t.Run("global", func(t *testing.T) {
		_, _, _, c, reg := harness(t, false, Limits{PerSource: 1e6, PerSourceBurst: 1e6, Global: 0.001, GlobalBurst: 10})
		for i := range 50 {
			if i%2 == 0 {
				c.Write(valid)
			} else {
				c.Write([]byte("junk"))
			}
		}
		got := waitCounted(t, reg, 50)
		if got[RateLimited] != 40 || got[Accepted]+got[Malformed] != 10 {
			t.Fatalf("results %v; want 40 rate limited", got)
		}
	})
}

// The real fence_kdump_send from the address of a node whose agent is live passes nothing on.
func TestLiveWitnessWins(t *testing.T) {
	l, _, seen, _, reg := harness(t, true, DefaultLimits())
	_, p, _ := net.SplitHostPort(l.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/usr/libexec/fence-agents/fence_kdump_send", "-p", p, "-c", "3", "-i", "1", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("fence_kdump_send: %v\n%s", err, out)
	}
	if got := waitCounted(t, reg, 3); got[LiveWitness] != 3 || len(seen) != 0 {
		t.Fatalf("results %v, %d passed on; want 3 dropped for the live witness", got, len(seen))
	}
}

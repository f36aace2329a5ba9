package kdump

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"
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

package tcpproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayed: a delaying proxy holds what the client sends for the set delay, keeps its order,
// and passes it on at once again after SetDelay(0, 0).
func TestDelayed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := StartDelayed("127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) time.Duration {
		t0 := time.Now()
		if _, err := fmt.Fprintln(c, msg); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := r.ReadString('\n')
		if err != nil || got != msg+"\n" {
			t.Fatalf("echo of %q: %q, %v", msg, got, err)
		}
		return time.Since(t0)
	}
	if d := roundTrip("fast"); d > 150*time.Millisecond {
		t.Errorf("round trip without delay took %s", d)
	}
	p.SetDelay(200*time.Millisecond, 400*time.Millisecond)
	for i := range 3 {
		if d := roundTrip(fmt.Sprint("slow ", i)); d < 200*time.Millisecond {
			t.Errorf("round trip with a 200-400 ms delay took %s", d)
		}
	}
	// Several lines at once arrive in order, each at least the minimum late.
	t0 := time.Now()
	for i := range 5 {
		fmt.Fprintln(c, "burst", i)
	}
	for i := range 5 {
		if got, err := r.ReadString('\n'); err != nil || got != fmt.Sprintln("burst", i) {
			t.Fatalf("line %d: %q, %v", i, got, err)
		}
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Errorf("burst took %s", d)
	}
	p.SetDelay(0, 0)
	if d := roundTrip("fast again"); d > 600*time.Millisecond {
		t.Errorf("round trip after SetDelay(0, 0) took %s", d)
	}
}

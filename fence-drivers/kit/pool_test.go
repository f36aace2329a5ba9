package kit

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nodefence/nodefence/services/fault"
)

type closeLog struct {
	mu     sync.Mutex
	closed []int
}

func (c *closeLog) close(s int) { c.mu.Lock(); c.closed = append(c.closed, s); c.mu.Unlock() }
func (c *closeLog) get() []int  { c.mu.Lock(); defer c.mu.Unlock(); return slices.Clone(c.closed) }

func TestPoolReusesMostRecentPerKey(t *testing.T) {
	var cl closeLog
	p := NewPool(2, time.Minute, cl.close)
	defer p.Close()
	if _, ok := p.Get("a"); ok {
		t.Fatal("empty pool gave a session")
	}
	p.Put("a", 1, true)
	p.Put("a", 2, true)
	p.Put("b", 3, true)
	if s, ok := p.Get("a"); !ok || s != 2 {
		t.Fatalf("Get(a) = %d, %v; want 2, true", s, ok)
	}
	if s, ok := p.Get("b"); !ok || s != 3 {
		t.Fatalf("Get(b) = %d, %v; want 3, true", s, ok)
	}
	if len(cl.get()) != 0 {
		t.Fatalf("closed %v, want none", cl.get())
	}
}

func TestPoolDropsFailedAndExcess(t *testing.T) {
	var cl closeLog
	p := NewPool(2, time.Minute, cl.close)
	defer p.Close()
	p.Put("a", 1, false) // failed: closed, not kept
	p.Put("a", 2, true)
	p.Put("a", 3, true)
	p.Put("a", 4, true) // beyond MaxIdle
	if got := cl.get(); !slices.Equal(got, []int{1, 4}) {
		t.Fatalf("closed %v, want [1 4]", got)
	}
	if p.Idle() != 2 {
		t.Fatalf("Idle() = %d, want 2", p.Idle())
	}
}

func TestPoolEvictsIdleSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cl closeLog
		p := NewPool(4, 10*time.Second, cl.close)
		p.Put("a", 1, true)
		time.Sleep(5 * time.Second)
		p.Put("a", 2, true)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if got := cl.get(); !slices.Equal(got, []int{1}) {
			t.Fatalf("after 11 s closed %v, want [1]", got)
		}
		if s, ok := p.Get("a"); !ok || s != 2 {
			t.Fatalf("Get(a) = %d, %v; want 2, true", s, ok)
		}
		p.Put("a", 2, true) // its idle time starts again
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if p.Idle() != 1 {
			t.Fatalf("Idle() = %d, want 1", p.Idle())
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := cl.get(); !slices.Equal(got, []int{1, 2}) || p.Idle() != 0 {
			t.Fatalf("closed %v, idle %d; want [1 2], 0", got, p.Idle())
		}
	})
}

func TestPoolCloseClosesIdleAndLaterPuts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cl closeLog
		p := NewPool(4, time.Minute, cl.close)
		p.Put("a", 1, true)
		p.Put("b", 2, true)
		p.Close()
		p.Put("a", 3, true)
		got := cl.get()
		slices.Sort(got)
		if !slices.Equal(got, []int{1, 2, 3}) {
			t.Fatalf("closed %v, want [1 2 3]", got)
		}
		time.Sleep(2 * time.Minute) // no timer closes a session twice
		synctest.Wait()
		if n := len(cl.get()); n != 3 {
			t.Fatalf("closed %d times, want 3", n)
		}
	})
}

func TestPoolWithoutReuseClosesEverything(t *testing.T) {
	var cl closeLog
	p := NewPool(2, -1, cl.close)
	p.Put("a", 1, true)
	if _, ok := p.Get("a"); ok || !slices.Equal(cl.get(), []int{1}) {
		t.Fatalf("a pool without idle time kept a session (closed %v)", cl.get())
	}
}

func TestSessionKeySeparatesParts(t *testing.T) {
	if SessionKey("ab", "c") == SessionKey("a", "bc") {
		t.Fatal("parts run together")
	}
	if a, b := SessionKey("a", 1), SessionKey("a", 1); a != b {
		t.Fatal("not deterministic")
	}
}

func TestPoolUseKeepsOnlyHealthySessions(t *testing.T) {
	var cl closeLog
	p := NewPool(4, time.Minute, cl.close)
	defer p.Close()
	next := 0
	dial := func() (int, error) { next++; return next, nil }
	var used []int
	use := func(err error) error {
		return p.Use("a", dial, func(s int) error { used = append(used, s); return err })
	}
	if err := use(nil); err != nil { // dials 1, keeps it
		t.Fatal(err)
	}
	bad := fault.FieldError{Field: "plug", Problem: "no such outlet"}
	if err := use(bad); !errors.Is(err, bad) { // reuses 1: a bad target says nothing about the session
		t.Fatalf("Use = %v, want the FieldError", err)
	}
	down := fmt.Errorf("%w: no answer", fault.ErrUnreachable)
	if err := use(down); !errors.Is(err, fault.ErrUnreachable) { // reuses 1, then drops it
		t.Fatalf("Use = %v, want ErrUnreachable", err)
	}
	if err := use(nil); err != nil { // dials 2
		t.Fatal(err)
	}
	if !slices.Equal(used, []int{1, 1, 1, 2}) || !slices.Equal(cl.get(), []int{1}) {
		t.Fatalf("used %v, closed %v; want [1 1 1 2], [1]", used, cl.get())
	}
	dialErr := errors.New("refused")
	p2 := NewPool(4, time.Minute, cl.close)
	if err := p2.Use("a", func() (int, error) { return 0, dialErr }, func(int) error { t.Fatal("fn ran without a session"); return nil }); !errors.Is(err, dialErr) {
		t.Fatalf("Use with a failing dial = %v", err)
	}
}

package clock

import (
	"testing"
	"time"
)

// A fake clock's waits fire when it is moved past them, earliest first, and not before.
func TestFakeFiresDueWaitsInOrder(t *testing.T) {
	start := time.Unix(100, 0)
	f := NewFake(start)
	late, early := f.After(2*time.Second), f.After(time.Second)
	select {
	case <-f.After(0):
	default:
		t.Fatal("After(0) did not fire at once")
	}
	f.Advance(999 * time.Millisecond)
	select {
	case <-early:
		t.Fatal("fired before its time")
	default:
	}
	if f.Waiters() != 2 {
		t.Fatalf("%d waiters, want 2", f.Waiters())
	}
	f.Advance(5 * time.Second)
	if at := <-early; !at.Equal(start.Add(5999 * time.Millisecond)) {
		t.Fatalf("fired with %v", at)
	}
	<-late
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters left", f.Waiters())
	}
	f.Set(start) // never back
	if !f.Now().Equal(start.Add(5999 * time.Millisecond)) {
		t.Fatalf("moved back to %v", f.Now())
	}
}

// Of reads the given function and waits on the machine's timers when given no wait.
func TestOfDefaultsToTheMachine(t *testing.T) {
	at := time.Unix(42, 0)
	c := Of(func() time.Time { return at }, nil)
	if !c.Now().Equal(at) {
		t.Fatalf("read %v", c.Now())
	}
	<-c.After(time.Millisecond)
	if d := time.Since(Of(nil, nil).Now()); d < 0 || d > time.Second {
		t.Fatalf("Of(nil, nil) is not the machine's clock: %v off", d)
	}
}

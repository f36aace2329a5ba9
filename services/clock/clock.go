// Package clock is a time source that reads and waits on one time: a part that decides by an
// injected clock must also wait on it, or a test that moves the clock sees the part wake by the
// machine's time and decide by its own.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock reads the time and waits on it.
type Clock interface {
	Now() time.Time
	// After sends the time on the channel once the clock has moved on by d (at once for d <= 0).
	After(d time.Duration) <-chan time.Time
}

// Machine is the machine's clock: the only place of the project's services that waits on the
// machine's timers directly.
var Machine Clock = machine{}

type machine struct{}

func (machine) Now() time.Time                         { return time.Now() }
func (machine) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Of returns the clock that reads now and waits with after; a nil now or after is the machine's.
// A reading function alone (an offset of the machine's clock, say) runs at the machine's rate, so
// the machine's timers wait on it correctly.
func Of(now func() time.Time, after func(time.Duration) <-chan time.Time) Clock {
	if now == nil {
		now = Machine.Now
	}
	if after == nil {
		after = Machine.After
	}
	return funcs{now, after}
}

type funcs struct {
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
}

func (f funcs) Now() time.Time                         { return f.now() }
func (f funcs) After(d time.Duration) <-chan time.Time { return f.after(d) }

// Fake is a clock that moves only when told (Advance, Set). Safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

// NewFake returns a fake clock reading at.
func NewFake(at time.Time) *Fake { return &Fake{now: at} }

// Now reads the fake clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After fires once the fake clock reads at least Now()+d.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if d <= 0 {
		c <- f.now
		return c
	}
	f.waiters = append(f.waiters, waiter{at: f.now.Add(d), c: c})
	return c
}

// Advance moves the clock on by d and fires every wait that is due, earliest first.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the clock to at (never back) and fires every wait that is due, earliest first.
func (f *Fake) Set(at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if at.After(f.now) {
		f.now = at
	}
	sort.SliceStable(f.waiters, func(i, j int) bool { return f.waiters[i].at.Before(f.waiters[j].at) })
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if w.at.After(f.now) {
			kept = append(kept, w)
			continue
		}
		w.c <- f.now
	}
	f.waiters = kept
}

// Waiters is the number of waits not fired yet: a test advances the clock once the part it drives
// waits.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

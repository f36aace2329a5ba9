// Package watchdogsim is a watchdog device for testbed nodes, which have no kernel module to load:
// a FIFO speaking the file interface of /dev/watchdog that node-agent/watchdog drives. Each byte a
// writer sends feeds it (the first one arms it); 'V' as the last byte before the writer closes
// disarms it (the magic close); a writer that closes without it leaves it armed. Armed and unfed for
// its timeout, it resets the node: OnReset is called once, as the node's BMC power-off would act,
// and the device waits to be armed again (the node's next boot). Nothing is simulated as success: a
// device nobody arms never resets, one armed and abandoned always does.
package watchdogsim

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// poll is how often the device looks for bytes and for its writer's close.
const poll = 10 * time.Millisecond

// State is where the device stands.
type State int

// States.
const (
	Disarmed State = iota // never armed, magic-closed, or reset and not armed again
	Armed                 // fed within its timeout
)

// Device is one node's watchdog stand-in.
type Device struct {
	Path    string
	Timeout time.Duration
	// OnReset is called (from the device's goroutine) when the armed device went unfed for Timeout.
	OnReset func()

	mu       sync.Mutex
	state    State
	lastFeed time.Time
	resets   int
	feeds    int
	stop     chan struct{}
	done     chan struct{}
}

// Start makes the FIFO at path and serves it until Stop.
func Start(path string, timeout time.Duration, onReset func()) (*Device, error) {
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("watchdog FIFO %s: %w", path, err)
	}
	// A raw non-blocking descriptor, not an os.File: Go's poller would make a read wait for a
	// writer that holds the FIFO open without writing — the hung feeder the device must reset.
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	d := &Device{Path: path, Timeout: timeout, OnReset: onReset, stop: make(chan struct{}), done: make(chan struct{})}
	go d.serve(fd)
	return d, nil
}

// serve reads the FIFO: bytes feed, the writer's close after 'V' disarms, silence past the timeout
// resets.
func (d *Device) serve(fd int) {
	defer close(d.done)
	defer syscall.Close(fd)
	t := time.NewTicker(poll)
	defer t.Stop()
	buf := make([]byte, 256)
	writer, magic := false, false
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		for {
			n, err := syscall.Read(fd, buf)
			switch {
			case n > 0:
				writer, magic = true, buf[n-1] == 'V'
				d.fed(n)
				continue
			case errors.Is(err, syscall.EAGAIN):
				writer = true // a writer holds it open, nothing to read
			case writer: // EOF: the writer closed
				writer = false
				if magic {
					d.setState(Disarmed)
				}
			}
			break
		}
		d.check()
	}
}

func (d *Device) fed(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state, d.lastFeed = Armed, time.Now()
	d.feeds += n
}

func (d *Device) setState(s State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state = s
}

// check resets the node when the armed device has gone unfed for its timeout.
func (d *Device) check() {
	d.mu.Lock()
	reset := d.state == Armed && time.Since(d.lastFeed) >= d.Timeout
	if reset {
		d.state = Disarmed
		d.resets++
	}
	d.mu.Unlock()
	if reset && d.OnReset != nil {
		d.OnReset()
	}
}

// State is the device's state now.
func (d *Device) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state
}

// Resets is how many times the device reset its node.
func (d *Device) Resets() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resets
}

// Feeds is how many bytes fed it.
func (d *Device) Feeds() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.feeds
}

// Stop stops serving and removes the FIFO.
func (d *Device) Stop() {
	close(d.stop)
	<-d.done
	os.Remove(d.Path)
}

// Package watchdogsim is a watchdog device for testbed nodes, which have no kernel module to load:
// a FIFO speaking the file interface of /dev/watchdog that node-agent/watchdog drives. Each byte a
// writer sends feeds it (the first one arms it); 'V' as the last byte before the writer closes
// disarms it (the magic close); a writer that closes without it leaves it armed. Armed and unfed for
// its timeout, it resets the node: OnReset is called once, as the node's BMC power-off would act,
// and the device waits to be armed again (the node's next boot). A writer may open it again after
// another closed (a restarted agent re-arms it). PowerLoss is the node losing power: the device is
// disarmed, as hardware boots with its watchdog off. Nothing is simulated as success: a device
// nobody arms never resets, one armed and abandoned always does.
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
	// OnReset is called (from the device's goroutine, which waits for it) when the armed device went
	// unfed for Timeout. It must not call PowerLoss itself: start a goroutine that does.
	OnReset func()

	mu       sync.Mutex
	state    State
	lastFeed time.Time
	resets   int
	feeds    int
	stop     chan struct{}
	done     chan struct{}
	power    chan chan struct{}
	stopOnce sync.Once
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
	d := &Device{Path: path, Timeout: timeout, OnReset: onReset, stop: make(chan struct{}), done: make(chan struct{}),
		power: make(chan chan struct{})}
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
		case ack := <-d.power:
			// Every writer died with the node: what they left unread feeds nothing, and the
			// device is off until a writer of the next boot arms it.
			for n, _ := syscall.Read(fd, buf); n > 0; n, _ = syscall.Read(fd, buf) {
			}
			writer, magic = false, false
			d.setState(Disarmed)
			close(ack)
			continue
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

// PowerLoss is the node losing power (its BMC's power-off, a reset): call it once the node's
// processes are dead. The device is disarmed and drops what its dead writers left unread, so it
// does not reset a node that is off; the next boot's writer arms it again. It returns once the
// device has done so (at once after Stop). Not from OnReset: the device waits for OnReset.
func (d *Device) PowerLoss() {
	ack := make(chan struct{})
	select {
	case d.power <- ack:
		<-ack
	case <-d.done:
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

// LastFeed is when a byte last fed it (zero before the first).
func (d *Device) LastFeed() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastFeed
}

// Feeds is how many bytes fed it.
func (d *Device) Feeds() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.feeds
}

// Stop stops serving and removes the FIFO. It is safe to call more than once.
func (d *Device) Stop() {
	d.stopOnce.Do(func() {
		close(d.stop)
		<-d.done
		os.Remove(d.Path)
	})
}

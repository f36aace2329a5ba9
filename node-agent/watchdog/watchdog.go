// Package watchdog drives a Linux watchdog device (/dev/watchdog, the kernel's
// Documentation/watchdog/watchdog-api): opening it arms it, every write feeds it, and a machine
// whose watchdog goes unfed for its timeout is reset by the hardware (or by softdog, the kernel).
// Writing the magic character 'V' before closing disarms it — only on a clean, intended stop — so a
// crashed or killed feeder that is not restarted within the timeout resets its machine. That is
// what makes a silent node provably stopped after a known time when no BMC answers (issue 24's proof
// by time): the node either feeds the watchdog, and so reports, or is reset.
//
// The timeout is set with WDIOC_SETTIMEOUT and read back with WDIOC_GETTIMEOUT (a device may round
// it); a device without those ioctls (a testbed stand-in, a FIFO) keeps the configured timeout, and
// Device says so.
package watchdog

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The Linux watchdog ioctls (include/uapi/linux/watchdog.h): _IOWR('W', 6, int) and _IOR('W', 7, int).
const (
	wdiocSetTimeout = 0xc0045706
	wdiocGetTimeout = 0x80045707
)

// MaxTimeout bounds the timeout a caller may ask for: a watchdog that waits longer than this is no
// proof of anything an operator would wait for.
const MaxTimeout = 10 * time.Minute

// Device is an armed watchdog. It is safe for concurrent use.
type Device struct {
	path    string
	timeout time.Duration
	// Ioctl is false when the device refused the timeout ioctls and the configured timeout is
	// assumed (a stand-in); true when the timeout was set and read back.
	Ioctl bool

	mu     sync.Mutex
	f      *os.File
	closed bool
}

// Open arms the watchdog at path with timeout (whole seconds, 1 s to MaxTimeout). The device's own
// reading of the timeout is what Timeout reports. A device that cannot be opened, or that refuses
// the timeout with an error other than "not supported", is an error: the caller must not run as if
// armed.
func Open(path string, timeout time.Duration) (*Device, error) {
	if timeout < time.Second || timeout > MaxTimeout || timeout%time.Second != 0 {
		return nil, fmt.Errorf("watchdog timeout %s: want whole seconds from 1s to %s", timeout, MaxTimeout)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("arm watchdog %s: %w", path, err)
	}
	d := &Device{path: path, timeout: timeout, f: f}
	secs := int(timeout / time.Second)
	switch err := unix.IoctlSetPointerInt(int(f.Fd()), wdiocSetTimeout, secs); {
	case err == nil:
		got, err := unix.IoctlGetInt(int(f.Fd()), wdiocGetTimeout)
		if err != nil || got <= 0 {
			_ = d.Disarm()
			return nil, fmt.Errorf("watchdog %s: read back the timeout: %v (got %d)", path, err, got)
		}
		d.timeout, d.Ioctl = time.Duration(got)*time.Second, true
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL) && !isCharDevice(f), errors.Is(err, unix.EOPNOTSUPP):
		// Not a watchdog character device (a testbed stand-in): the configured timeout stands.
	default:
		_ = d.Disarm()
		return nil, fmt.Errorf("watchdog %s refuses a %ds timeout: %w", path, secs, err)
	}
	if err := d.Feed(); err != nil {
		_ = d.Disarm()
		return nil, err
	}
	return d, nil
}

func isCharDevice(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Timeout is the watchdog's timeout as the device reads it (or as configured, without the ioctls).
func (d *Device) Timeout() time.Duration { return d.timeout }

// Path is the device's path.
func (d *Device) Path() string { return d.path }

// Feed keeps the machine alive for another Timeout.
func (d *Device) Feed() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("watchdog %s: fed after it was closed", d.path)
	}
	if _, err := d.f.Write([]byte{'1'}); err != nil {
		return fmt.Errorf("feed watchdog %s: %w", d.path, err)
	}
	return nil
}

// Disarm writes the magic close and closes the device: a clean, intended stop (a rollout) resets
// nothing. Call it only when the node's agent stops on purpose.
func (d *Device) Disarm() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	_, werr := d.f.Write([]byte{'V'})
	cerr := d.f.Close()
	return errors.Join(werr, cerr)
}

// Abandon closes the device WITHOUT the magic close: the watchdog stays armed and resets the machine
// after its timeout unless someone opens and feeds it again. For a feeder that must stop feeding now
// (told to self-fence) and for tests.
func (d *Device) Abandon() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.f.Close()
}

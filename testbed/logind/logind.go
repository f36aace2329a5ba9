// Package logind is a minimal stand-in for systemd-logind on a private D-Bus: it owns
// org.freedesktop.login1, answers Manager.Inhibit with a real pipe fd (and notices when the holder
// closes it, which releases the lock), reports InhibitDelayMaxUSec, and emits PrepareForShutdown on
// demand. StartBus runs a real dbus-daemon for it.
//
// Like logind, the stand-in keeps the read end of a pipe and hands out the write end; the lock is
// released when every copy of the write end is closed, which the read end sees as end-of-file.
package logind

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

// The names logind uses.
const (
	Service   = "org.freedesktop.login1"
	Path      = dbus.ObjectPath("/org/freedesktop/login1")
	Interface = "org.freedesktop.login1.Manager"
)

// Bus is a private dbus-daemon.
type Bus struct {
	// Address is the bus address to connect to ("unix:path=...").
	Address string
	cmd     *exec.Cmd
	stderr  *bytes.Buffer
}

// ErrNoDaemon is returned by StartBus when dbus-daemon is not installed.
var ErrNoDaemon = errors.New("dbus-daemon not found: install the Debian package dbus (apt-get install -y dbus)")

const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
</busconfig>
`

// StartBus starts a dbus-daemon listening on a socket in dir and waits until it accepts
// connections. Stop it with Close.
func StartBus(ctx context.Context, dir string) (*Bus, error) {
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		return nil, ErrNoDaemon
	}
	sock := filepath.Join(dir, "bus.sock")
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(busConfig, sock)), 0o600); err != nil {
		return nil, err
	}
	b := &Bus{Address: "unix:path=" + sock, stderr: &bytes.Buffer{}}
	b.cmd = exec.Command(daemon, "--nofork", "--nopidfile", "--nosyslog", "--config-file="+conf)
	b.cmd.Stdout, b.cmd.Stderr = b.stderr, b.stderr
	if err := b.cmd.Start(); err != nil {
		return nil, err
	}
	for {
		conn, err := dbus.Connect(b.Address)
		if err == nil {
			conn.Close()
			return b, nil
		}
		select {
		case <-ctx.Done():
			b.Close()
			return nil, fmt.Errorf("dbus-daemon did not come up: %w (last error %v; output %q)", ctx.Err(), err, b.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Output returns what the daemon wrote so far. Call it after Close.
func (b *Bus) Output() string { return b.stderr.String() }

// Close stops the daemon.
func (b *Bus) Close() {
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	}
}

// Lock is one inhibitor lock the stand-in handed out.
type Lock struct {
	What, Who, Why, Mode string
	// Taken is when Inhibit answered.
	Taken time.Time
	// Released is closed when the holder has closed every copy of the fd.
	Released chan struct{}
	// ReleasedAt is when the release was noticed; read it after Released is closed.
	ReleasedAt time.Time
}

// Server is the login1 stand-in.
type Server struct {
	conn *dbus.Conn
	// InhibitDelayMax is reported as InhibitDelayMaxUSec.
	inhibitDelayMax time.Duration

	mu    sync.Mutex
	locks []*Lock
	added chan struct{} // closed and replaced when a lock is added
}

// Serve connects to the bus at address, takes the name org.freedesktop.login1 and exports the
// Manager object.
func Serve(address string, inhibitDelayMax time.Duration) (*Server, error) {
	conn, err := dbus.Connect(address)
	if err != nil {
		return nil, err
	}
	s := &Server{conn: conn, inhibitDelayMax: inhibitDelayMax, added: make(chan struct{})}
	if err := conn.Export(manager{s}, Path, Interface); err != nil {
		conn.Close()
		return nil, err
	}
	props := prop.Map{Interface: {
		"InhibitDelayMaxUSec": {Value: uint64(inhibitDelayMax / time.Microsecond), Emit: prop.EmitFalse},
	}}
	if _, err := prop.Export(conn, Path, props); err != nil {
		conn.Close()
		return nil, err
	}
	reply, err := conn.RequestName(Service, dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		conn.Close()
		return nil, fmt.Errorf("request name %s: reply %v, %v", Service, reply, err)
	}
	return s, nil
}

// Close disconnects from the bus.
func (s *Server) Close() error { return s.conn.Close() }

// PrepareForShutdown emits Manager.PrepareForShutdown(active).
func (s *Server) PrepareForShutdown(active bool) error {
	return s.conn.Emit(Path, Interface+".PrepareForShutdown", active)
}

// Locks returns the locks handed out so far.
func (s *Server) Locks() []*Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Lock(nil), s.locks...)
}

// WaitLocks waits until at least n locks have been handed out and returns them.
func (s *Server) WaitLocks(ctx context.Context, n int) ([]*Lock, error) {
	for {
		s.mu.Lock()
		locks, added := append([]*Lock(nil), s.locks...), s.added
		s.mu.Unlock()
		if len(locks) >= n {
			return locks, nil
		}
		select {
		case <-ctx.Done():
			return locks, fmt.Errorf("waiting for %d inhibitor locks, have %d: %w", n, len(locks), ctx.Err())
		case <-added:
		}
	}
}

// manager is the exported org.freedesktop.login1.Manager object.
type manager struct{ s *Server }

// Inhibit answers with the write end of a new pipe and watches the read end for the release.
//
// The reply is sent here, by hand, rather than returned: the stand-in must close its own copy of
// the write end once the fd is on its way (as logind does), and godbus sends a returned value only
// after the method has returned. godbus then sends an empty second reply, which dbus-daemon drops
// as unrequested; the client has its fd by then.
func (m manager) Inhibit(msg dbus.Message, what, who, why, mode string) *dbus.Error {
	if mode != "block" && mode != "delay" {
		return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"mode must be block or delay"})
	}
	for _, w := range strings.Split(what, ":") {
		switch w {
		case "shutdown", "sleep", "idle", "handle-power-key", "handle-suspend-key", "handle-hibernate-key", "handle-lid-switch":
		default:
			return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"invalid what " + w})
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return dbus.MakeFailedError(err)
	}
	reply := &dbus.Message{
		Type: dbus.TypeMethodReply,
		Headers: map[dbus.HeaderField]dbus.Variant{
			dbus.FieldReplySerial: dbus.MakeVariant(msg.Serial()),
			dbus.FieldSignature:   dbus.MakeVariant(dbus.SignatureOf(dbus.UnixFD(0))),
		},
		Body: []any{dbus.UnixFD(w.Fd())},
	}
	if sender, ok := msg.Headers[dbus.FieldSender]; ok {
		reply.Headers[dbus.FieldDestination] = sender
	}
	call := m.s.conn.Send(reply, nil)
	<-call.Done
	_ = w.Close()
	if call.Err != nil {
		_ = r.Close()
		return dbus.MakeFailedError(call.Err)
	}
	l := &Lock{What: what, Who: who, Why: why, Mode: mode, Taken: time.Now(), Released: make(chan struct{})}
	go func() {
		var buf [64]byte
		for {
			if _, err := r.Read(buf[:]); err != nil {
				break // EOF: every write end is closed
			}
		}
		_ = r.Close()
		l.ReleasedAt = time.Now()
		close(l.Released)
	}()
	m.s.mu.Lock()
	m.s.locks = append(m.s.locks, l)
	close(m.s.added)
	m.s.added = make(chan struct{})
	m.s.mu.Unlock()
	return nil
}

package shutdown

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/godbus/dbus/v5"
)

// logind's D-Bus names.
const (
	LogindService   = "org.freedesktop.login1"
	LogindPath      = dbus.ObjectPath("/org/freedesktop/login1")
	LogindInterface = "org.freedesktop.login1.Manager"
)

// systemd's D-Bus names, which reload logind: logind re-reads its configuration on SIGHUP, and
// systemd's Manager.KillUnit sends it.
const (
	SystemdService   = "org.freedesktop.systemd1"
	SystemdPath      = dbus.ObjectPath("/org/freedesktop/systemd1")
	SystemdInterface = "org.freedesktop.systemd1.Manager"
	// LogindUnit is logind's systemd unit.
	LogindUnit = "systemd-logind.service"
	// sighup is SIGHUP's number, which KillUnit takes as an int32.
	sighup int32 = 1
)

// Logind is a connection to systemd-logind (org.freedesktop.login1) for inhibitor locks and the
// PrepareForShutdown signal.
type Logind struct {
	conn    *dbus.Conn
	obj     dbus.BusObject
	signals chan *dbus.Signal
	prepare chan bool
	done    chan struct{}
}

// DialLogind connects to the bus at address (the system bus when empty) and subscribes to
// PrepareForShutdown. The connection must support unix fd passing: Inhibit returns an fd. ctx
// bounds the setup only; the connection lives until Close.
func DialLogind(ctx context.Context, address string) (*Logind, error) {
	var conn *dbus.Conn
	var err error
	// Not dbus.Connect with dbus.WithContext: godbus closes such a connection when ctx ends, and
	// the Manager, whose context may be a child of ctx, would see logind vanish before its own
	// context is cancelled.
	if address == "" {
		conn, err = dbus.SystemBusPrivate()
	} else {
		conn, err = dbus.Dial(address)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the D-Bus %s: %w", busName(address), err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() }) // aborts a setup that hangs
	fail := func(err error) (*Logind, error) {
		stop()
		_ = conn.Close()
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, err
	}
	if err := conn.Auth(nil); err != nil {
		return fail(fmt.Errorf("authenticate to the D-Bus %s: %w", busName(address), err))
	}
	if err := conn.Hello(); err != nil {
		return fail(fmt.Errorf("connect to the D-Bus %s: %w", busName(address), err))
	}
	if !conn.SupportsUnixFDs() {
		return fail(fmt.Errorf("the D-Bus %s does not pass unix fds, which inhibitor locks need", busName(address)))
	}
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchInterface(LogindInterface), dbus.WithMatchMember("PrepareForShutdown"),
		dbus.WithMatchObjectPath(LogindPath)); err != nil {
		return fail(fmt.Errorf("subscribe to PrepareForShutdown: %w", err))
	}
	if !stop() { // ctx ended: the connection is closed or closing
		return fail(fmt.Errorf("connect to the D-Bus %s: %w", busName(address), ctx.Err()))
	}
	l := &Logind{
		conn: conn, obj: conn.Object(LogindService, LogindPath),
		signals: make(chan *dbus.Signal, 16), prepare: make(chan bool, 16), done: make(chan struct{}),
	}
	conn.Signal(l.signals)
	go l.forward()
	return l, nil
}

func busName(address string) string {
	if address == "" {
		return "system bus"
	}
	return "bus " + address
}

// forward turns PrepareForShutdown signals into bools until the connection closes.
func (l *Logind) forward() {
	defer close(l.prepare)
	for {
		select {
		case <-l.done:
			return
		case s, ok := <-l.signals:
			if !ok {
				return
			}
			if s.Name != LogindInterface+".PrepareForShutdown" || len(s.Body) != 1 {
				continue
			}
			if active, ok := s.Body[0].(bool); ok {
				select {
				case l.prepare <- active:
				case <-l.done:
					return
				}
			}
		}
	}
}

// PrepareForShutdown delivers logind's PrepareForShutdown values: true when the shutdown starts,
// false when it is cancelled. It is closed when the connection is.
func (l *Logind) PrepareForShutdown() <-chan bool { return l.prepare }

// Inhibit takes an inhibitor lock: Manager.Inhibit(what, who, why, mode). The lock is held as long
// as the returned file is open; closing it releases the lock.
func (l *Logind) Inhibit(ctx context.Context, what, who, why, mode string) (*os.File, error) {
	var fd dbus.UnixFD
	if err := l.obj.CallWithContext(ctx, LogindInterface+".Inhibit", 0, what, who, why, mode).Store(&fd); err != nil {
		return nil, fmt.Errorf("logind Inhibit(%s, %s): %w", what, mode, err)
	}
	return os.NewFile(uintptr(fd), "logind-inhibitor"), nil
}

// InhibitDelayMax reads logind's InhibitDelayMaxUSec: the longest a delay lock may hold a
// shutdown back.
func (l *Logind) InhibitDelayMax(ctx context.Context) (uint64, error) {
	var v dbus.Variant
	if err := l.obj.CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, LogindInterface, "InhibitDelayMaxUSec").Store(&v); err != nil {
		return 0, err
	}
	us, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("InhibitDelayMaxUSec is %s, not a uint64", v.Signature())
	}
	return us, nil
}

// ReloadLogind asks systemd, on the same bus, to send logind SIGHUP:
// Manager.KillUnit("systemd-logind.service", "all", SIGHUP). logind re-reads logind.conf and its
// drop-ins when it handles the signal, which may be after the call has returned.
func (l *Logind) ReloadLogind(ctx context.Context) error {
	obj := l.conn.Object(SystemdService, SystemdPath)
	if err := obj.CallWithContext(ctx, SystemdInterface+".KillUnit", 0, LogindUnit, "all", sighup).Err; err != nil {
		return fmt.Errorf("systemd KillUnit(%s, all, SIGHUP): %w", LogindUnit, err)
	}
	return nil
}

// Close closes the connection.
func (l *Logind) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return l.conn.Close()
}

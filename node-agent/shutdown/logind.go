package shutdown

import (
	"context"
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
// PrepareForShutdown. The connection must support unix fd passing: Inhibit returns an fd.
func DialLogind(ctx context.Context, address string) (*Logind, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus(dbus.WithContext(ctx))
	} else {
		conn, err = dbus.Connect(address, dbus.WithContext(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the D-Bus %s: %w", busName(address), err)
	}
	if !conn.SupportsUnixFDs() {
		conn.Close()
		return nil, fmt.Errorf("the D-Bus %s does not pass unix fds, which inhibitor locks need", busName(address))
	}
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchInterface(LogindInterface), dbus.WithMatchMember("PrepareForShutdown"),
		dbus.WithMatchObjectPath(LogindPath)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("subscribe to PrepareForShutdown: %w", err)
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
	v, err := l.obj.GetProperty(LogindInterface + ".InhibitDelayMaxUSec")
	if err != nil {
		return 0, err
	}
	us, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("InhibitDelayMaxUSec is %s, not a uint64", v.Signature())
	}
	return us, nil
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

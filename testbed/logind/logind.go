// Package logind is a minimal stand-in for systemd-logind on a private D-Bus: it owns
// org.freedesktop.login1, answers Manager.Inhibit with a real pipe fd (and notices when the holder
// closes it, which releases the lock), reports InhibitDelayMaxUSec, and emits PrepareForShutdown on
// demand. StartBus runs a real dbus-daemon for it.
//
// Like logind, the stand-in keeps the read end of a pipe and hands out the write end; the lock is
// released when every copy of the write end is closed, which the read end sees as end-of-file.
//
// It also owns org.freedesktop.systemd1 for one call: Manager.KillUnit("systemd-logind.service",
// _, SIGHUP) reloads the stand-in's configuration, taking InhibitDelayMaxSec from the *.conf files
// of Config.ConfDir as logind takes it from logind.conf.d. Reloads fail by default (no ConfDir),
// and a file the stand-in cannot parse fails the reload and keeps the old value.
package logind

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// The names systemd uses, and the unit and signal KillUnit reloads logind with.
const (
	SystemdService   = "org.freedesktop.systemd1"
	SystemdPath      = dbus.ObjectPath("/org/freedesktop/systemd1")
	SystemdInterface = "org.freedesktop.systemd1.Manager"
	LogindUnit       = "systemd-logind.service"
	SIGHUP           = 1
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

// Config configures the stand-in.
type Config struct {
	// InhibitDelayMax is logind.conf's InhibitDelayMaxSec: reported as InhibitDelayMaxUSec until a
	// reload, and the value a reload starts from before the drop-ins override it.
	InhibitDelayMax time.Duration
	// ConfDir is the logind.conf.d a reload reads: the *.conf files in name order, the last
	// InhibitDelayMaxSec under [Login] winning. A missing directory holds no drop-ins. Empty: every
	// reload fails.
	ConfDir string
	// ReloadDelay is how long after KillUnit has answered the reloaded value shows, as logind
	// handles the SIGHUP after systemd has sent it. The files are read at once.
	ReloadDelay time.Duration
}

// Server is the login1 stand-in.
type Server struct {
	conn  *dbus.Conn
	cfg   Config
	props *prop.Properties

	mu      sync.Mutex
	locks   []*Lock
	added   chan struct{} // closed and replaced when a lock is added
	reloads int
}

// Serve connects to the bus at address, takes the name org.freedesktop.login1 and exports the
// Manager object, reporting inhibitDelayMax. Its reloads fail: see ServeConfig.
func Serve(address string, inhibitDelayMax time.Duration) (*Server, error) {
	return ServeConfig(address, Config{InhibitDelayMax: inhibitDelayMax})
}

// ServeConfig connects to the bus at address, takes the names org.freedesktop.login1 and
// org.freedesktop.systemd1 and exports their Manager objects.
func ServeConfig(address string, cfg Config) (*Server, error) {
	conn, err := dbus.Connect(address)
	if err != nil {
		return nil, err
	}
	s := &Server{conn: conn, cfg: cfg, added: make(chan struct{})}
	if err := conn.Export(manager{s}, Path, Interface); err != nil {
		conn.Close()
		return nil, err
	}
	if err := conn.Export(systemdManager{s}, SystemdPath, SystemdInterface); err != nil {
		conn.Close()
		return nil, err
	}
	props := prop.Map{Interface: {
		"InhibitDelayMaxUSec": {Value: usec(cfg.InhibitDelayMax), Emit: prop.EmitFalse},
	}}
	if s.props, err = prop.Export(conn, Path, props); err != nil {
		conn.Close()
		return nil, err
	}
	for _, name := range []string{Service, SystemdService} {
		reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue)
		if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
			conn.Close()
			return nil, fmt.Errorf("request name %s: reply %v, %v", name, reply, err)
		}
	}
	return s, nil
}

func usec(d time.Duration) uint64 { return uint64(d / time.Microsecond) }

// InhibitDelayMax returns the InhibitDelayMaxUSec reported now.
func (s *Server) InhibitDelayMax() time.Duration {
	return time.Duration(s.props.GetMust(Interface, "InhibitDelayMaxUSec").(uint64)) * time.Microsecond
}

// Reloads returns how many reloads KillUnit has accepted.
func (s *Server) Reloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloads
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

// reload reads the configuration and, after ReloadDelay, reports its InhibitDelayMaxSec. On any
// error it changes nothing.
func (s *Server) reload() error {
	if s.cfg.ConfDir == "" {
		return errors.New("the stand-in has no logind.conf.d directory: reloads fail")
	}
	d, err := readConfDir(s.cfg.ConfDir, s.cfg.InhibitDelayMax)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.reloads++
	s.mu.Unlock()
	apply := func() { s.props.SetMust(Interface, "InhibitDelayMaxUSec", usec(d)) }
	if s.cfg.ReloadDelay > 0 {
		time.AfterFunc(s.cfg.ReloadDelay, apply)
	} else {
		apply()
	}
	return nil
}

// readConfDir returns the InhibitDelayMaxSec of base overridden by the *.conf files of dir, in
// name order.
func readConfDir(dir string, base time.Duration) (time.Duration, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return base, nil
	}
	if err != nil {
		return 0, err
	}
	d := base
	for _, e := range entries { // sorted by name
		if !strings.HasSuffix(e.Name(), ".conf") || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		text, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		v, ok, err := ParseLoginConf(string(text))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		if ok {
			d = v
		}
	}
	return d, nil
}

// ParseLoginConf returns the InhibitDelayMaxSec that one logind.conf file sets under [Login]; ok
// is false when it sets none. Comments (# and ;), blank lines, other sections and other keys are
// skipped; a line that is neither a section nor key=value, an assignment outside any section and
// a value ParseTimespan rejects are errors.
func ParseLoginConf(text string) (d time.Duration, ok bool, err error) {
	section := ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
			continue
		case line[0] == '[':
			if len(line) < 3 || line[len(line)-1] != ']' {
				return 0, false, fmt.Errorf("line %d: bad section header %q", i+1, line)
			}
			section = line[1 : len(line)-1]
			continue
		}
		key, value, found := strings.Cut(line, "=")
		if !found {
			return 0, false, fmt.Errorf("line %d: %q is not key=value", i+1, line)
		}
		if section == "" {
			return 0, false, fmt.Errorf("line %d: %q is outside any section", i+1, line)
		}
		if section != "Login" || strings.TrimSpace(key) != "InhibitDelayMaxSec" {
			continue
		}
		if d, err = ParseTimespan(value); err != nil {
			return 0, false, fmt.Errorf("line %d: InhibitDelayMaxSec: %w", i+1, err)
		}
		ok = true
	}
	return d, ok, nil
}

// timespanUnits are systemd's time span units this stand-in knows.
var timespanUnits = map[string]time.Duration{
	"us": time.Microsecond, "usec": time.Microsecond,
	"ms": time.Millisecond, "msec": time.Millisecond,
	"": time.Second, "s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// ParseTimespan parses a systemd time span with whole numbers: "30" (seconds), "30s", "1min",
// "1min 30s", "2m30s". Fractions, signs, "infinity" and unknown units are errors.
func ParseTimespan(s string) (time.Duration, error) {
	rest := strings.TrimSpace(s)
	if rest == "" {
		return 0, errors.New("empty time span")
	}
	var total time.Duration
	for rest != "" {
		n := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if n < 0 {
			n = len(rest)
		}
		if n == 0 {
			return 0, fmt.Errorf("time span %q: want a whole number at %q", s, rest)
		}
		num, err := strconv.ParseInt(rest[:n], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("time span %q: %w", s, err)
		}
		rest = strings.TrimLeft(rest[n:], " \t")
		u := strings.IndexFunc(rest, func(r rune) bool { return r < 'a' || r > 'z' })
		if u < 0 {
			u = len(rest)
		}
		unit, ok := timespanUnits[rest[:u]]
		if !ok {
			return 0, fmt.Errorf("time span %q: unknown unit %q", s, rest[:u])
		}
		rest = strings.TrimLeft(rest[u:], " \t")
		if num > int64((math.MaxInt64-total)/unit) {
			return 0, fmt.Errorf("time span %q: too long", s)
		}
		total += time.Duration(num) * unit
	}
	return total, nil
}

// systemdManager is the exported org.freedesktop.systemd1.Manager object, which knows one call.
type systemdManager struct{ s *Server }

// KillUnit sends signal to the unit's processes; the stand-in knows only SIGHUP to
// systemd-logind.service, which reloads it. Anything else is a D-Bus error.
func (m systemdManager) KillUnit(name, who string, signal int32) *dbus.Error {
	if name != LogindUnit {
		return dbus.NewError("org.freedesktop.systemd1.NoSuchUnit", []any{fmt.Sprintf("Unit %s not loaded.", name)})
	}
	switch who {
	case "all", "main", "control":
	default:
		return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{fmt.Sprintf("invalid who %q", who)})
	}
	if signal != SIGHUP {
		return dbus.NewError("org.freedesktop.DBus.Error.NotSupported", []any{fmt.Sprintf("the logind stand-in handles only SIGHUP (1), not signal %d", signal)})
	}
	if err := m.s.reload(); err != nil {
		return dbus.NewError("org.freedesktop.DBus.Error.Failed", []any{"logind stand-in reload: " + err.Error()})
	}
	return nil
}

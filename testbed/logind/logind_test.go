package logind

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

func TestParseTimespan(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  string // part of the error; "" means no error
	}{
		{in: "30", want: 30 * time.Second},
		{in: " 30s ", want: 30 * time.Second},
		{in: "1min", want: time.Minute},
		{in: "1min 30s", want: 90 * time.Second},
		{in: "2m30s", want: 150 * time.Second},
		{in: "5 sec", want: 5 * time.Second},
		{in: "1h", want: time.Hour},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "0", want: 0},
		{in: "", err: "empty"},
		{in: "   ", err: "empty"},
		{in: "1.5s", err: "whole number"},
		{in: "-5s", err: "whole number"},
		{in: "+5s", err: "whole number"},
		{in: "s", err: "whole number"},
		{in: "infinity", err: "whole number"},
		{in: "5 fortnights", err: `unknown unit "fortnights"`},
		{in: "5S", err: `want a whole number at "S"`}, // units are lower case
		{in: "99999999999999999999", err: "out of range"},
		{in: "9999999999999999s", err: "too long"},
		{in: "106751d 106751d", err: "too long"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTimespan(tt.in)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("ParseTimespan(%q): %v", tt.in, err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("ParseTimespan(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.err)
			case tt.err == "" && got != tt.want:
				t.Fatalf("ParseTimespan(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzParseTimespan(f *testing.F) {
	for _, s := range []string{"30", "1min 30s", "2m30s", "1.5s", "", "106751d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseTimespan(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseTimespan(%q) = %v < 0", s, d)
		}
		if d%time.Microsecond == 0 {
			back, err := ParseTimespan(fmt.Sprintf("%dus", d/time.Microsecond))
			if err != nil || back != d {
				t.Fatalf("ParseTimespan(%q) = %v, but its µs form reads back as %v, %v", s, d, back, err)
			}
		}
	})
}

func TestParseLoginConf(t *testing.T) {
	tests := []struct {
		name string
		text string
		want time.Duration
		ok   bool
		err  string
	}{
		{name: "kubelet's", text: "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n", want: 30 * time.Second, ok: true},
		{name: "spaces and CRLF", text: "[Login]\r\n  InhibitDelayMaxSec = 1min \r\n", want: time.Minute, ok: true},
		{name: "last wins", text: "[Login]\nInhibitDelayMaxSec=5\nInhibitDelayMaxSec=7\n", want: 7 * time.Second, ok: true},
		{name: "other keys and sections", text: "; c\n[Login]\nKillUserProcesses=no\n[Other]\nInhibitDelayMaxSec=9\n", ok: false},
		{name: "empty", text: "", ok: false},
		{name: "no equals", text: "[Login]\nInhibitDelayMaxSec 30\n", err: "line 2: \"InhibitDelayMaxSec 30\" is not key=value"},
		{name: "outside a section", text: "InhibitDelayMaxSec=30\n", err: "line 1: \"InhibitDelayMaxSec=30\" is outside any section"},
		{name: "bad header", text: "[Login\nInhibitDelayMaxSec=30\n", err: "line 1: bad section header"},
		{name: "empty header", text: "[]\n", err: "line 1: bad section header"},
		{name: "bad value", text: "[Login]\nInhibitDelayMaxSec=soon\n", err: "line 2: InhibitDelayMaxSec: time span \"soon\""},
		{name: "empty value", text: "[Login]\nInhibitDelayMaxSec=\n", err: "line 2: InhibitDelayMaxSec: empty time span"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := ParseLoginConf(tt.text)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("ParseLoginConf: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("ParseLoginConf = %v, %v, %v; want an error with %q", got, ok, err, tt.err)
			case tt.err == "" && (got != tt.want || ok != tt.ok):
				t.Fatalf("ParseLoginConf = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzParseLoginConf(f *testing.F) {
	f.Add("[Login]\nInhibitDelayMaxSec=30\n")
	f.Add("[Login]\r\nInhibitDelayMaxSec = 1min 30s\r\n# c\n")
	f.Fuzz(func(t *testing.T, text string) {
		if d, ok, err := ParseLoginConf(text); err == nil && ok && d < 0 {
			t.Fatalf("ParseLoginConf(%q) = %v < 0", text, d)
		}
	})
}

// serve starts a dbus-daemon and the stand-in with cfg, and returns a client connection to it.
func serve(t *testing.T, ctx context.Context, cfg Config) (*Server, *dbus.Conn) {
	t.Helper()
	bus, err := StartBus(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Close)
	s, err := ServeConfig(bus.Address, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	conn, err := dbus.Connect(bus.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return s, conn
}

func killUnit(ctx context.Context, conn *dbus.Conn, unit, who string, signal int32) error {
	return conn.Object(SystemdService, SystemdPath).CallWithContext(ctx, SystemdInterface+".KillUnit", 0, unit, who, signal).Err
}

func reported(ctx context.Context, t *testing.T, conn *dbus.Conn) time.Duration {
	t.Helper()
	var v dbus.Variant
	if err := conn.Object(Service, Path).CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, Interface, "InhibitDelayMaxUSec").Store(&v); err != nil {
		t.Fatal(err)
	}
	return time.Duration(v.Value().(uint64)) * time.Microsecond
}

// TestKillUnitReloads: SIGHUP to systemd-logind.service applies the drop-ins in name order over
// the base value; everything else is a D-Bus error that changes nothing.
func TestKillUnitReloads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, conn := serve(t, ctx, Config{InhibitDelayMax: 5 * time.Second, ConfDir: dir})

	// No drop-ins yet: the base value.
	if err := killUnit(ctx, conn, LogindUnit, "all", SIGHUP); err != nil {
		t.Fatal(err)
	}
	if got := reported(ctx, t, conn); got != 5*time.Second {
		t.Errorf("after a reload without drop-ins: %v, want 5s", got)
	}

	write("50-a.conf", "[Login]\nInhibitDelayMaxSec=1min\n")
	write("60-b.conf", "[Login]\nInhibitDelayMaxSec=1min 30s\n")
	write("70-c.conf.disabled", "[Login]\nInhibitDelayMaxSec=1\n")
	write("80-d.conf", "[Login]\nKillUserProcesses=no\n")
	if err := killUnit(ctx, conn, LogindUnit, "all", SIGHUP); err != nil {
		t.Fatal(err)
	}
	if got := reported(ctx, t, conn); got != 90*time.Second {
		t.Errorf("after the reload: %v, want 1m30s from 60-b.conf", got)
	}

	for _, tt := range []struct {
		name, unit, who string
		signal          int32
		errName, errMsg string
	}{
		{"unknown unit", "sshd.service", "all", SIGHUP, "org.freedesktop.systemd1.NoSuchUnit", "sshd.service"},
		{"bad who", LogindUnit, "everyone", SIGHUP, "org.freedesktop.DBus.Error.InvalidArgs", "everyone"},
		{"SIGTERM", LogindUnit, "all", 15, "org.freedesktop.DBus.Error.NotSupported", "signal 15"},
		{"unparsable drop-in", LogindUnit, "all", SIGHUP, "org.freedesktop.DBus.Error.Failed", "90-broken.conf: line 2: InhibitDelayMaxSec"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "unparsable drop-in" {
				write("90-broken.conf", "[Login]\nInhibitDelayMaxSec=soon\n")
			}
			err := killUnit(ctx, conn, tt.unit, tt.who, tt.signal)
			var de dbus.Error
			if !errors.As(err, &de) || de.Name != tt.errName || !strings.Contains(err.Error(), tt.errMsg) {
				t.Errorf("KillUnit(%s, %s, %d) = %v; want %s naming %q", tt.unit, tt.who, tt.signal, err, tt.errName, tt.errMsg)
			}
			if got := reported(ctx, t, conn); got != 90*time.Second {
				t.Errorf("a failed KillUnit changed the value to %v", got)
			}
		})
	}
	if got := s.Reloads(); got != 2 {
		t.Errorf("Reloads() = %d, want the 2 that succeeded", got)
	}
}

// TestReloadFailsWithoutConfDir: the stand-in fails reloads by default.
func TestReloadFailsWithoutConfDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, conn := serve(t, ctx, Config{InhibitDelayMax: 5 * time.Second})
	if err := killUnit(ctx, conn, LogindUnit, "all", SIGHUP); err == nil || !strings.Contains(err.Error(), "no logind.conf.d directory") {
		t.Errorf("KillUnit = %v; want the reload to fail", err)
	}
	if got := s.InhibitDelayMax(); got != 5*time.Second || s.Reloads() != 0 {
		t.Errorf("InhibitDelayMax() = %v, Reloads() = %d; want 5s and none", got, s.Reloads())
	}
}

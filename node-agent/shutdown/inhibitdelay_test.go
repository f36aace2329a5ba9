package shutdown

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/quick"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/testbed/logind"
)

func TestRenderDropIn(t *testing.T) {
	tests := []struct {
		want time.Duration
		secs string
	}{
		{30 * time.Second, "30"},
		{95 * time.Second, "95"},
		{2500 * time.Millisecond, "3"}, // rounded up: never below the grace period
		{time.Nanosecond, "1"},
		{time.Hour, "3600"},
	}
	for _, tt := range tests {
		t.Run(tt.want.String(), func(t *testing.T) {
			want := "# Written by the nodefence node-agent: logind must let its delay inhibitor lock hold a\n" +
				"# shutdown back for the whole shutdown grace period (" + tt.want.String() + ").\n" +
				"[Login]\nInhibitDelayMaxSec=" + tt.secs + "\n"
			if diff := cmp.Diff(want, renderDropIn(tt.want)); diff != "" {
				t.Errorf("renderDropIn(%v) (-want +got):\n%s", tt.want, diff)
			}
			// What the stand-in, which parses like logind, reads back.
			got, ok, err := logind.ParseLoginConf(renderDropIn(tt.want))
			if err != nil || !ok || got < tt.want {
				t.Errorf("the drop-in for %v reads back as %v, %v, %v", tt.want, got, ok, err)
			}
		})
	}
}

// TestDropInSeconds checks the rounding against a dumb reference: the least whole number of
// seconds that is not below want.
func TestDropInSeconds(t *testing.T) {
	ref := func(ns uint32) int64 {
		want := time.Duration(ns) * 1000 // up to ~71 min, in µs steps
		var s int64
		for time.Duration(s)*time.Second < want {
			s++
		}
		return s
	}
	got := func(ns uint32) int64 { return dropInSeconds(time.Duration(ns) * 1000) }
	if err := quick.CheckEqual(got, ref, &quick.Config{MaxCount: 200}); err != nil {
		t.Error(err)
	}
}

func TestInhibitDelayShort(t *testing.T) {
	tests := []struct {
		current, want time.Duration
		short         bool
	}{
		{5 * time.Second, 30 * time.Second, true},
		{30*time.Second - time.Microsecond, 30 * time.Second, true},
		{30 * time.Second, 30 * time.Second, false},
		{time.Minute, 30 * time.Second, false},
		{USecDuration(math.MaxUint64), 24 * time.Hour, false}, // logind's infinity
	}
	for _, tt := range tests {
		if got := inhibitDelayShort(tt.current, tt.want); got != tt.short {
			t.Errorf("inhibitDelayShort(%v, %v) = %v, want %v", tt.current, tt.want, got, tt.short)
		}
	}
}

func TestUsecDuration(t *testing.T) {
	tests := []struct {
		us   uint64
		want time.Duration
	}{
		{0, 0},
		{5_000_000, 5 * time.Second},
		{math.MaxInt64 / 1000, time.Duration(math.MaxInt64/1000) * time.Microsecond},
		{math.MaxInt64/1000 + 1, math.MaxInt64},
		{math.MaxUint64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := USecDuration(tt.us); got != tt.want {
			t.Errorf("USecDuration(%d) = %v, want %v", tt.us, got, tt.want)
		}
	}
}

// dialStandIn starts a real dbus-daemon, the login1 stand-in with cfg, and a Logind connected to it.
func dialStandIn(t *testing.T, ctx context.Context, cfg logind.Config) (*Logind, *logind.Server) {
	t.Helper()
	bus := startBus(t, ctx)
	login1, err := logind.ServeConfig(bus.Address, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = login1.Close() })
	l, err := DialLogind(ctx, bus.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, login1
}

// dirNames lists dir, nil when it does not exist.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestEnsureInhibitDelayRaises: logind's value below the grace period → the drop-in is written
// (after another drop-in with a smaller value, which it overrides), logind reloaded through
// systemd1 KillUnit, and the new value, which logind shows only a moment after the reload, read back.
func TestEnsureInhibitDelayRaises(t *testing.T) {
	tests := []struct {
		grace, after time.Duration
		secs         string
	}{
		{95 * time.Second, 95 * time.Second, "95"},
		{2500 * time.Millisecond, 3 * time.Second, "3"},
	}
	for _, tt := range tests {
		t.Run(tt.grace.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			confDir := filepath.Join(t.TempDir(), "logind.conf.d") // created by EnsureInhibitDelay
			l, login1 := dialStandIn(t, ctx, logind.Config{InhibitDelayMax: time.Second, ConfDir: confDir, ReloadDelay: 300 * time.Millisecond})
			if err := os.MkdirAll(confDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(confDir, "50-vendor.conf"), []byte("[Login]\nInhibitDelayMaxSec=2\n"), 0o644); err != nil {
				t.Fatal(err)
			}

			got, err := EnsureInhibitDelay(ctx, l, confDir, tt.grace)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(confDir, DropInName)
			if diff := cmp.Diff(InhibitDelay{Before: time.Second, After: tt.after, DropIn: path}, got); diff != "" {
				t.Errorf("EnsureInhibitDelay (-want +got):\n%s", diff)
			}
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(string(text), "\n[Login]\nInhibitDelayMaxSec="+tt.secs+"\n") || string(text) != renderDropIn(tt.grace) {
				t.Errorf("%s:\n%s\nwant InhibitDelayMaxSec=%s under [Login]", path, text, tt.secs)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("%s: %v, %v; want mode 0644", path, fi.Mode(), err)
			}
			if diff := cmp.Diff([]string{"50-vendor.conf", DropInName}, dirNames(t, confDir)); diff != "" {
				t.Errorf("files in %s (-want +got), no temporary file left:\n%s", confDir, diff)
			}
			if n := login1.Reloads(); n != 1 {
				t.Errorf("logind reloaded %d times, want once", n)
			}
			if us, err := l.InhibitDelayMax(ctx); err != nil || time.Duration(us)*time.Microsecond != tt.after {
				t.Errorf("InhibitDelayMaxUSec = %d, %v; want %v", us, err, tt.after)
			}
		})
	}
}

// TestEnsureInhibitDelaySufficient: logind's value already covers the grace period → nothing is
// written (the directory is not even created) and logind is not reloaded.
func TestEnsureInhibitDelaySufficient(t *testing.T) {
	for _, grace := range []time.Duration{10 * time.Second, 30 * time.Second} {
		t.Run(grace.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			confDir := filepath.Join(t.TempDir(), "logind.conf.d")
			l, login1 := dialStandIn(t, ctx, logind.Config{InhibitDelayMax: 30 * time.Second, ConfDir: confDir})
			got, err := EnsureInhibitDelay(ctx, l, confDir, grace)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(InhibitDelay{Before: 30 * time.Second, After: 30 * time.Second}, got); diff != "" {
				t.Errorf("EnsureInhibitDelay (-want +got):\n%s", diff)
			}
			if _, err := os.Stat(confDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: %v; want it never created", confDir, err)
			}
			if n := login1.Reloads(); n != 0 {
				t.Errorf("logind reloaded %d times, want never", n)
			}
		})
	}
}

// TestEnsureInhibitDelayFails: when logind does not take the new value, or the reload fails,
// EnsureInhibitDelay says so, naming the drop-in and both values.
func TestEnsureInhibitDelayFails(t *testing.T) {
	tests := []struct {
		name string
		// logindDir is the directory the stand-in reads, relative to the test's temporary
		// directory; the agent writes to "agent". "" means the stand-in has none: reloads fail.
		logindDir string
		// setup prepares logindDir.
		setup    func(t *testing.T, dir string)
		sentinel error
		wantErr  []string
		reloads  int
	}{
		{
			name: "logind reads another directory", logindDir: "logind", reloads: 1,
			sentinel: ErrInhibitDelayShort,
			wantErr:  []string{"agent/" + DropInName, "InhibitDelayMaxSec=60", "logind still reports 5s", "want at least 1m0s", "does logind read drop-ins from"},
		},
		{
			name: "reload fails", logindDir: "",
			wantErr: []string{"reload logind after writing", "agent/" + DropInName, "KillUnit(systemd-logind.service, all, SIGHUP)", "no logind.conf.d directory"},
		},
		{
			name: "logind cannot parse a drop-in", logindDir: "agent",
			setup: func(t *testing.T, dir string) {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "10-broken.conf"), []byte("[Login]\nInhibitDelayMaxSec=soon\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: []string{"reload logind after writing", "10-broken.conf: line 2: InhibitDelayMaxSec"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tmp := t.TempDir()
			cfg := logind.Config{InhibitDelayMax: 5 * time.Second}
			if tt.logindDir != "" {
				cfg.ConfDir = filepath.Join(tmp, tt.logindDir)
				if tt.setup != nil {
					tt.setup(t, cfg.ConfDir)
				}
			}
			l, login1 := dialStandIn(t, ctx, cfg)
			agentDir := filepath.Join(tmp, "agent")

			got, err := EnsureInhibitDelay(ctx, l, agentDir, time.Minute)
			t.Log(err)
			if err == nil {
				t.Fatalf("EnsureInhibitDelay = %+v, nil; want an error", got)
			}
			if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
				t.Errorf("error %v is not %v", err, tt.sentinel)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			want := InhibitDelay{Before: 5 * time.Second, After: 5 * time.Second, DropIn: filepath.Join(agentDir, DropInName)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("EnsureInhibitDelay (-want +got):\n%s", diff)
			}
			if n := login1.Reloads(); n != tt.reloads {
				t.Errorf("logind reloaded %d times, want %d", n, tt.reloads)
			}
			if d := login1.InhibitDelayMax(); d != 5*time.Second {
				t.Errorf("the stand-in reports %v, want its old 5s kept", d)
			}
		})
	}
}

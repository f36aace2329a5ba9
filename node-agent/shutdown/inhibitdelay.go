package shutdown

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"
)

// Where the agent raises logind's InhibitDelayMaxSec, as kubelet does with
// /etc/systemd/logind.conf.d/99-kubelet.conf.
const (
	DefaultLogindConfDir = "/etc/systemd/logind.conf.d"
	// DropInName sorts after the usual drop-ins, so that its value wins.
	DropInName = "99-nodefence.conf"
)

// How long EnsureInhibitDelay waits for logind to show the new value after the reload, and how
// often it looks: logind handles the SIGHUP after systemd has answered KillUnit.
const (
	reloadWait = 2 * time.Second
	reloadPoll = 50 * time.Millisecond
)

// ErrInhibitDelayShort means logind's InhibitDelayMaxSec is still below the shutdown grace period
// after the drop-in was written and logind reloaded: logind will end the delay lock early.
var ErrInhibitDelayShort = errors.New("logind's InhibitDelayMaxSec is below the shutdown grace period")

// InhibitDelay is what EnsureInhibitDelay found and did.
type InhibitDelay struct {
	// Before is logind's InhibitDelayMaxUSec when EnsureInhibitDelay started.
	Before time.Duration
	// After is the value read last: Before when nothing had to change.
	After time.Duration
	// DropIn is the drop-in written, "" when Before already covered the grace period.
	DropIn string
}

// EnsureInhibitDelay makes logind's InhibitDelayMaxSec at least want, the shutdown grace period,
// as kubelet does: when logind's value is below it, it writes confDir/99-nodefence.conf, asks
// systemd over l's bus to send logind SIGHUP, and reads the value again for up to 2 s. The error
// wraps ErrInhibitDelayShort when logind still reports too little. When the value already
// suffices it writes nothing.
func EnsureInhibitDelay(ctx context.Context, l *Logind, confDir string, want time.Duration) (InhibitDelay, error) {
	var res InhibitDelay
	us, err := l.InhibitDelayMax(ctx)
	if err != nil {
		return res, fmt.Errorf("read logind's InhibitDelayMaxUSec: %w", err)
	}
	res.Before = USecDuration(us)
	res.After = res.Before
	if !inhibitDelayShort(res.Before, want) {
		return res, nil
	}
	path := filepath.Join(confDir, DropInName)
	if err := writeFileAtomic(path, []byte(renderDropIn(want)), 0o644); err != nil {
		return res, fmt.Errorf("write logind drop-in: %w", err)
	}
	res.DropIn = path
	if err := l.ReloadLogind(ctx); err != nil {
		return res, fmt.Errorf("reload logind after writing %s: %w", path, err)
	}

	wctx, cancel := context.WithTimeout(ctx, reloadWait)
	defer cancel()
	tick := time.NewTicker(reloadPoll)
	defer tick.Stop()
	var readErr error // the last read's, if it failed
	for {
		us, err := l.InhibitDelayMax(wctx)
		switch {
		case err == nil:
			readErr = nil
			if res.After = USecDuration(us); !inhibitDelayShort(res.After, want) {
				return res, nil
			}
		case wctx.Err() == nil:
			readErr = err
		}
		select {
		case <-wctx.Done():
			if err := ctx.Err(); err != nil {
				return res, fmt.Errorf("waiting for logind to reload: %w", err)
			}
			if readErr != nil {
				return res, fmt.Errorf("read logind's InhibitDelayMaxUSec after writing %s and reloading logind: %w", path, readErr)
			}
			return res, fmt.Errorf("%w: %v after writing %s (InhibitDelayMaxSec=%d) and reloading logind, logind still reports %v, want at least %v; does logind read drop-ins from %s?",
				ErrInhibitDelayShort, reloadWait, path, dropInSeconds(want), res.After, want, confDir)
		case <-tick.C:
		}
	}
}

// inhibitDelayShort reports whether logind's InhibitDelayMaxSec current is below want, the
// shutdown grace period, so that a delay lock would be ended before the grace period is over.
func inhibitDelayShort(current, want time.Duration) bool { return current < want }

// dropInSeconds is want in whole seconds, rounded up: InhibitDelayMaxSec must not fall short of it.
func dropInSeconds(want time.Duration) int64 {
	s := int64(want / time.Second)
	if want%time.Second > 0 {
		s++
	}
	return s
}

// renderDropIn is the logind drop-in that sets InhibitDelayMaxSec to want.
func renderDropIn(want time.Duration) string {
	return fmt.Sprintf("# Written by the nodefence node-agent: logind must let its delay inhibitor lock hold a\n"+
		"# shutdown back for the whole shutdown grace period (%v).\n[Login]\nInhibitDelayMaxSec=%d\n", want, dropInSeconds(want))
}

// USecDuration converts logind's microseconds, whose infinity is the largest uint64, to a
// Duration, saturating where a Duration ends.
func USecDuration(us uint64) time.Duration {
	if us > math.MaxInt64/uint64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// writeFileAtomic writes path through a temporary file in its directory, which it creates, and a
// rename, so that logind never reads half a file. The temporary name does not end in .conf:
// logind ignores it.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

package nfcluster

import (
	"strings"
	"testing"
	"time"
)

// A watchdog timeout the agent would refuse is named before anything starts.
func TestOptionsWatchdog(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		bad     bool
	}{{0, false}, {6 * time.Second, false}, {500 * time.Millisecond, true}, {1500 * time.Millisecond, true}, {-time.Second, true}} {
		o := Options{Watchdog: tc.timeout}
		o.setDefaults()
		err := o.check() // BinDir and Dir are missing: check names them too
		if got := err != nil && strings.Contains(err.Error(), "Watchdog: whole seconds"); got != tc.bad {
			t.Errorf("Watchdog %s: %v", tc.timeout, err)
		}
	}
}

// Package wait is the testbed tests' polling helper: a condition that becomes true some time after
// an action (a record written, a stream closed) is checked again until it holds or a deadline
// passes. It imports testing, so no shipped binary may import it (testbed/shipped checks).
package wait

import (
	"testing"
	"time"
)

// Interval is the pause between two checks.
const Interval = 50 * time.Millisecond

// Until calls f every Interval until it returns nil; when timeout passes first, it fails the test
// with what and f's last error.
func Until(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(Interval)
	}
	t.Fatalf("%s: not true after %s: %v", what, timeout, err)
}

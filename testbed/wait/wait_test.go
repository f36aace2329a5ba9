package wait

import (
	"errors"
	"testing"
	"time"
)

func TestUntilReturnsOnceTrue(t *testing.T) {
	calls := 0
	Until(t, 5*time.Second, "third call", func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("f called %d times, want 3", calls)
	}
}

// fatal records Fatalf instead of stopping the goroutine, so the failing path can be checked.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper()                        {}
func (f *fatal) Fatalf(format string, a ...any) { f.msg = format }

func TestUntilFailsAfterTimeout(t *testing.T) {
	var f fatal
	Until(&f, 3*Interval, "never", func() error { return errors.New("still false") })
	if f.msg == "" {
		t.Error("Until returned without failing though f never held")
	}
}

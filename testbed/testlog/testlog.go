// Package testlog sends what the parts a test runs log into that test's own log (t.Log): a failed
// test shows what its coordinator, drivers and agents said, a passing one stays quiet (go test
// prints a test's log only when it fails or with -v).
package testlog

import (
	"log/slog"
	"strings"
	"testing"
)

// Writer logs each write as one entry of T's log, without its trailing newline.
type Writer struct{ T testing.TB }

func (w Writer) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// New is a text logger into t's log that keeps records at level and above.
func New(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(Writer{t}, &slog.HandlerOptions{Level: level}))
}

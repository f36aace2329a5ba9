package testlog

import (
	"log/slog"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what is logged to it.
type recorder struct {
	testing.TB
	lines []string
}

func (r *recorder) Log(args ...any) {
	for _, a := range args {
		r.lines = append(r.lines, a.(string))
	}
}

func TestRecordsAtTheLevelReachTheTestsLog(t *testing.T) {
	r := &recorder{TB: t}
	log := New(r, slog.LevelWarn)
	log.Info("below the level")
	log.Warn("kept", "node", "node-1")
	if len(r.lines) != 1 {
		t.Fatalf("logged %q, want only the warning", r.lines)
	}
	if l := r.lines[0]; strings.HasSuffix(l, "\n") || !strings.Contains(l, "level=WARN") || !strings.Contains(l, `msg=kept node=node-1`) {
		t.Fatalf("logged %q, want one text record without its newline", l)
	}
}

// Package cli holds what every nodefence binary's main does the same way: a JSON or text slog
// logger at a chosen level, a context cancelled by SIGINT or SIGTERM (SIGHUP re-reads TLS files), and startup errors listed
// one a line. EnumWord, the human word for a protobuf enum value, is here too for now (fencectl,
// the metrics and the Kubernetes events share it).
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Logger returns a slog logger writing to w at level ("debug", "info", "warn", "error"), as JSON
// when json is set.
func Logger(w io.Writer, level string, json bool) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if json {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// SignalContext is cancelled on SIGINT or SIGTERM. Until then SIGHUP makes every TLS reloader of
// the process read its certificate, key and CA files at its next use (tlsfiles.Recheck) instead
// of ending the process.
func SignalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				tlsfiles.Recheck()
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, cancel
}

// Errors lists the errors of an errors.Join result (or of a single error), one string each, so a
// binary that refuses to start can print every problem on its own line.
func Errors(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, Errors(e)...)
		}
		return out
	}
	return []string{err.Error()}
}

// EnumWord turns a protobuf enum value name into the lowercase word after its type prefix, for
// human output: FENCE_STATUS_DONE -> done, READINESS_NOT_READY -> not_ready.
func EnumWord(name string) string {
	for _, prefix := range []string{"FENCE_STATUS_", "FENCE_ACTION_", "FENCE_STEP_", "READINESS_", "ZONE_STATE_", "OPERATION_RESULT_", "POWER_STATE_"} {
		if s, ok := strings.CutPrefix(name, prefix); ok {
			return strings.ToLower(s)
		}
	}
	return strings.ToLower(name)
}

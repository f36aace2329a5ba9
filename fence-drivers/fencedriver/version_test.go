package fencedriver

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nodefence/nodefence/services/cli"
)

// run is Main as the binary runs it: SIGINT or SIGTERM stops it (the tests signal themselves).
func run(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := cli.SignalContext()
	defer cancel()
	return Main(ctx, args, stdout, stderr)
}

// --version prints the binary's name and build, and exits 0 without serving (no --driver needed).
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--version: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.HasPrefix(out, "fence-driver ") || strings.Count(out, "\n") != 1 {
		t.Errorf("--version printed %q, want one line starting with \"fence-driver \"", out)
	}
}

package nodeagent

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// --version prints the binary's name and build, and exits 0 without running (no --coordinator
// needed).
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--version: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.HasPrefix(out, "node-agent ") || strings.Count(out, "\n") != 1 {
		t.Errorf("--version printed %q, want one line starting with \"node-agent \"", out)
	}
}

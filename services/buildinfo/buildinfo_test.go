package buildinfo

import (
	"strings"
	"testing"
)

func TestStringNamesBinaryAndVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })

	Version = "v9.8.7"
	got := String("fencectl")
	if !strings.HasPrefix(got, "fencectl v9.8.7 (revision ") || !strings.Contains(got, "go1.") {
		t.Fatalf("String = %q, want the binary, the stamped version, a revision and the Go version", got)
	}

	Version = ""
	if v := Read().Version; v == "" {
		t.Fatal("Read().Version is empty without a stamped version; want a fallback")
	}
}

// Package buildinfo says which build of nodefence is running: every binary's `--version` (and
// fencectl's `version`) prints String. The release version is stamped at link time by the
// Makefile (-ldflags "-X github.com/nodefence/nodefence/services/buildinfo.Version=v1.2.3");
// without it the version control facts Go records in the binary are used.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, set by the linker; empty in a plain `go build`.
var Version string

// Info is what is known about the running build.
type Info struct {
	Version   string // release version, or "devel"
	Revision  string // version control revision, "" when unknown
	Modified  bool   // the tree had uncommitted changes
	GoVersion string
}

// Read returns the running binary's build facts.
func Read() Info {
	info := Info{Version: Version, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	return info
}

// String is the one-line answer to `<binary> --version`.
func String(binary string) string {
	i := Read()
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		rev = "unknown"
	}
	if i.Modified {
		rev += "-dirty"
	}
	return fmt.Sprintf("%s %s (revision %s, %s)", binary, i.Version, rev, i.GoVersion)
}

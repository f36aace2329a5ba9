package shipped

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// listeners are the programs whose listening ports docs/operations.md lists.
var listeners = []string{"coordinator", "fence-driver", "node-agent"}

// portRow is a row of the ports table: | `program` | `--flag` | ...
var portRow = regexp.MustCompile("(?m)^\\| `([a-z-]+)` \\| `(--[a-z-]+)` \\|")

// The ports and firewall table of docs/operations.md names only flags its programs have, and
// every -listen flag of the coordinator, the fence driver and the agent is in it.
func TestPortsTableMatchesFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	b, err := os.ReadFile(filepath.Join(root(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	inTable := map[string]map[string]bool{}
	rows := portRow.FindAllStringSubmatch(string(b), -1)
	if len(rows) == 0 {
		t.Fatal("docs/operations.md: no ports table rows found: the extraction is broken")
	}
	sets := flagSets(t)
	for _, r := range rows {
		prog, flag := r[1], r[2]
		if !slices.Contains(listeners, prog) {
			continue // etcd: a program we do not build
		}
		if inTable[prog] == nil {
			inTable[prog] = map[string]bool{}
		}
		inTable[prog][flag] = true
		if !sets[prog][flag] {
			t.Errorf("docs/operations.md ports table: %s has no %s", prog, flag)
		}
	}
	for _, prog := range listeners {
		for flag := range sets[prog] {
			if strings.HasSuffix(flag, "-listen") && !inTable[prog][flag] {
				t.Errorf("docs/operations.md ports table: %s %s listens and is missing", prog, flag)
			}
		}
	}
}

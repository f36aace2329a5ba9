package shipped

import (
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/nodefence/nodefence"

// binaries are the programs an operator installs (deploy/, the images). Benchmarks and simulators
// under the testbed are not shipped and may import what they like.
var binaries = []string{
	module + "/coordinator/cmd/coordinator",
	module + "/coordinator/cmd/fencectl",
	module + "/node-agent/cmd/node-agent",
	module + "/fence-drivers/cmd/fence-driver",
}

// forbidden lists what no shipped binary may link, each with the reason. A path ending in "/..."
// forbids the package and everything under it.
var forbidden = []struct{ pkg, why string }{
	{"testing/...", "testing and its subpackages (quick, synctest, fstest) are for tests: in a binary they are dead weight at best, test code running in production at worst"},
	{"net/http/httptest", "an in-process test server has no place in a binary that talks to real peers"},
	{module + "/testbed/...", "simulators, fake cloud APIs, test PKI and harnesses: a shipped binary must never be able to talk to a simulator or carry test keys"},
	{module + "/fence-drivers/conformance", "the driver conformance suite is a test (it imports testing and the simulators)"},
}

// excused names the only importers allowed to bring in a forbidden package, each with the reason.
// Each entry must still be needed: once the importer stops importing it, the test fails so the
// excuse is removed.
var excused = []struct{ pkg, importer, why string }{
	{"testing", "github.com/stmcginnis/gofish/schemas", "upstream: gofish v0.26.0 (the redfish driver's client) ships test assertions in a non-test file, " +
		"schemas/testutil.go, which nothing calls. Our own Redfish client, or a gofish release without that file, " +
		"removes this excuse"},
}

func matches(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// importers returns, for each package the binary links, the packages of the binary that import it.
func importers(t *testing.T, bin string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", bin, err, out)
	}
	by := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if _, ok := by[f[0]]; !ok {
			by[f[0]] = nil
		}
		for _, imp := range f[1:] {
			by[imp] = append(by[imp], f[0])
		}
	}
	return by
}

// violations lists what bin links against forbidden, marking in used the excuses it relied on.
func violations(t *testing.T, bin string, used map[int]bool) []string {
	by := importers(t, bin)
	if _, ok := by[bin]; !ok {
		t.Fatalf("go list did not list %s itself", bin)
	}
	var pkgs []string
	for p := range by {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	var bad []string
	for _, p := range pkgs {
		for _, f := range forbidden {
			if !matches(f.pkg, p) {
				continue
			}
			for _, imp := range by[p] {
				if i := excuse(p, imp); i >= 0 {
					used[i] = true
					continue
				}
				bad = append(bad, fmt.Sprintf("%s links %s (imported by %s): %s", bin, p, imp, f.why))
			}
		}
	}
	return bad
}

// TestShippedBinariesLinkNoTestCode keeps testing and the testbed out of every shipped binary
// (the idea of tailscale's deptest, written for this tree).
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over every binary")
	}
	used := map[int]bool{}
	for _, bin := range binaries {
		for _, v := range violations(t, bin, used) {
			t.Error(v)
		}
	}
	for i, e := range excused {
		if !used[i] {
			t.Errorf("the excuse for %s imported by %s is no longer needed: remove it", e.pkg, e.importer)
		}
	}
}

func excuse(pkg, importer string) int {
	for i, e := range excused {
		if e.pkg == pkg && e.importer == importer {
			return i
		}
	}
	return -1
}

// The checker itself finds a forbidden import where there is one: a testbed command links the
// testbed.
func TestCheckerFindsTestbedImport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	bad := violations(t, module+"/testbed/cmd/bench-failover", map[int]bool{})
	for _, v := range bad {
		if strings.Contains(v, "links "+module+"/testbed/") {
			return
		}
	}
	t.Fatalf("bench-failover: no testbed import found among %q", bad)
}

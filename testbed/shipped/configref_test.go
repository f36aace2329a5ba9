package shipped

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodefence/nodefence/testbed/flagdoc"
)

// The committed flag reference of docs/configuration.md is what the programs' help says today: a
// flag added, removed or reworded without `make docs` fails here, as a stale generated file fails
// check-generated.
func TestConfigurationReferenceFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	texts, err := helps()
	if err != nil {
		t.Fatal(err)
	}
	generated, err := flagdoc.Reference(texts)
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root(t), flagdoc.Page))
	if err != nil {
		t.Fatal(err)
	}
	want, err := flagdoc.Splice(string(page), generated)
	if err != nil {
		t.Fatal(err)
	}
	if want != string(page) {
		t.Fatalf("%s is stale: run `make docs` (go run ./testbed/cmd/flagdoc); its reference should read:\n%s", flagdoc.Page, generated)
	}
	for _, f := range []string{"`--listen`", "`--node-monitor-grace-period`", "`--eviction-hard`", "`--driver`"} {
		if !strings.Contains(generated, f) {
			t.Errorf("the reference has no %s", f)
		}
	}
}

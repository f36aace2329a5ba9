// Command flagdoc writes the flag reference of docs/configuration.md from the programs' own help:
// it builds the coordinator, the node-agent and the fence-driver, runs each with -h, and replaces
// the part of the page between its two markers (package testbed/flagdoc). `make docs` runs it; with
// -check it changes nothing and exits 1 when the page is stale.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nodefence/nodefence/testbed/flagdoc"
)

func main() {
	check := flag.Bool("check", false, "change nothing; exit 1 if "+flagdoc.Page+" is stale")
	root := flag.String("root", "", "the module's root (default: go list -m)")
	flag.Parse()
	if err := run(*root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "flagdoc:", err)
		os.Exit(1)
	}
}

func run(root string, check bool) error {
	if root == "" {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			return fmt.Errorf("go list -m: %w", err)
		}
		root = strings.TrimSpace(string(out))
	}
	helps, err := buildHelps(root)
	if err != nil {
		return err
	}
	want, err := flagdoc.Reference(helps)
	if err != nil {
		return err
	}
	path := filepath.Join(root, flagdoc.Page)
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	page, err := flagdoc.Splice(string(old), want)
	if err != nil {
		return fmt.Errorf("%s: %w", flagdoc.Page, err)
	}
	switch {
	case page == string(old):
		return nil
	case check:
		return fmt.Errorf("%s is stale: run `make docs` (go run ./testbed/cmd/flagdoc)", flagdoc.Page)
	}
	return os.WriteFile(path, []byte(page), 0o644)
}

// buildHelps builds the programs in root and returns what each prints for -h.
func buildHelps(root string) (map[string]string, error) {
	dir, err := os.MkdirTemp("", "flagdoc")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + "/"}
	for _, p := range flagdoc.Programs {
		args = append(args, p.Pkg)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	helps := map[string]string{}
	for _, p := range flagdoc.Programs {
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(dir, p.Name), "-h")
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run() // -h exits 0 or 2, as the flag package decides
		helps[p.Name] = out.String()
	}
	return helps, nil
}

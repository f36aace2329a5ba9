// Command flagdoc writes the flag reference of docs/configuration.md from the programs' own help:
// it builds the coordinator, the node-agent and the fence-driver, runs each with -h, and replaces
// the part of the page between its two markers. `make docs` runs it; with -check it changes nothing
// and exits 1 when the page is stale (its test, TestConfigurationReferenceFresh, does the same).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Page is the document, relative to the module root, and the markers around its generated part.
const (
	Page        = "docs/configuration.md"
	BeginMarker = "<!-- BEGIN GENERATED FLAGS: go run ./testbed/cmd/flagdoc; do not edit by hand -->"
	EndMarker   = "<!-- END GENERATED FLAGS -->"
)

// programs are the documented programs, in the page's order, with their packages.
var programs = []struct{ name, pkg string }{
	{"coordinator", "./coordinator/cmd/coordinator"},
	{"node-agent", "./node-agent/cmd/node-agent"},
	{"fence-driver", "./fence-drivers/cmd/fence-driver"},
}

func main() {
	check := flag.Bool("check", false, "change nothing; exit 1 if "+Page+" is stale")
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
	want, err := Generate(root)
	if err != nil {
		return err
	}
	path := filepath.Join(root, Page)
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	page, err := Splice(string(old), want)
	if err != nil {
		return fmt.Errorf("%s: %w", Page, err)
	}
	switch {
	case page == string(old):
		return nil
	case check:
		return fmt.Errorf("%s is stale: run `make docs` (go run ./testbed/cmd/flagdoc)", Page)
	}
	return os.WriteFile(path, []byte(page), 0o644)
}

// Generate builds the programs in root and renders their flags.
func Generate(root string) (string, error) {
	dir, err := os.MkdirTemp("", "flagdoc")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + "/"}
	for _, p := range programs {
		args = append(args, p.pkg)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	var b strings.Builder
	for _, p := range programs {
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(dir, p.name), "-h")
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run() // -h exits 0 or 2, as the flag package decides
		flags := ParseHelp(out.String())
		if len(flags) == 0 {
			return "", fmt.Errorf("%s -h printed no flags:\n%s", p.name, out.String())
		}
		fmt.Fprintf(&b, "\n### %s\n\nAs `%s -h` prints them:\n\n", p.name, p.name)
		b.WriteString(Render(flags))
	}
	return b.String(), nil
}

// Flag is one flag as the flag package's -h prints it.
type Flag struct {
	Name, Type, Usage, Default string
}

var (
	flagLineRE = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: ([A-Za-z0-9_]+))?(?:\t(.*))?$`)
	defaultRE  = regexp.MustCompile(` \(default (.*)\)$`)
)

// ParseHelp reads the flags from the flag package's PrintDefaults format: "  -name type" and the
// usage on lines starting "    \t" (on the same line after a tab for a one-letter name), the
// default last in parentheses. Other lines (a usage summary) are skipped.
func ParseHelp(help string) []Flag {
	var flags []Flag
	for _, line := range strings.Split(help, "\n") {
		if m := flagLineRE.FindStringSubmatch(line); m != nil {
			flags = append(flags, Flag{Name: m[1], Type: m[2], Usage: m[3]})
			continue
		}
		if rest, ok := strings.CutPrefix(line, "    \t"); ok && len(flags) > 0 {
			f := &flags[len(flags)-1]
			f.Usage = strings.TrimSpace(f.Usage + " " + rest)
		}
	}
	for i := range flags {
		if m := defaultRE.FindStringSubmatch(flags[i].Usage); m != nil {
			flags[i].Usage = strings.TrimSuffix(flags[i].Usage, m[0])
			flags[i].Default = strings.Trim(m[1], `"`)
		}
	}
	return flags
}

var cellEscaper = strings.NewReplacer("|", `\|`, "<", `&lt;`, ">", `&gt;`, "*", `\*`, "`", "'")

// Render writes the flags as a Markdown table.
func Render(flags []Flag) string {
	var b strings.Builder
	b.WriteString("| flag | type | default | what it sets |\n| --- | --- | --- | --- |\n")
	for _, f := range flags {
		typ, def := f.Type, ""
		if typ == "" {
			typ = "bool"
		}
		if f.Default != "" {
			def = "`" + strings.ReplaceAll(f.Default, "`", "'") + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", f.Name, typ, strings.ReplaceAll(def, "|", `\|`), cellEscaper.Replace(f.Usage))
	}
	return b.String()
}

// Splice replaces what is between the page's markers with generated.
func Splice(page, generated string) (string, error) {
	head, rest, ok := strings.Cut(page, BeginMarker)
	if !ok {
		return "", errors.New("no begin marker " + BeginMarker)
	}
	_, tail, ok := strings.Cut(rest, EndMarker)
	if !ok {
		return "", errors.New("no end marker " + EndMarker)
	}
	return head + BeginMarker + "\n" + generated + "\n" + EndMarker + tail, nil
}

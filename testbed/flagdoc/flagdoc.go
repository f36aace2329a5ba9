// Package flagdoc renders the flag reference of docs/configuration.md from the programs' own -h
// output (the flag package's PrintDefaults format) and splices it between the page's markers.
// testbed/cmd/flagdoc (`make docs`) writes the page; testbed/shipped's TestConfigurationReferenceFresh
// fails when it is stale.
package flagdoc

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Page is the document, relative to the module root, and the markers around its generated part.
const (
	Page        = "docs/configuration.md"
	BeginMarker = "<!-- BEGIN GENERATED FLAGS: go run ./testbed/cmd/flagdoc; do not edit by hand -->"
	EndMarker   = "<!-- END GENERATED FLAGS -->"
)

// Programs are the documented programs, in the page's order, with their packages.
var Programs = []struct{ Name, Pkg string }{
	{"coordinator", "./coordinator/cmd/coordinator"},
	{"node-agent", "./node-agent/cmd/node-agent"},
	{"fence-driver", "./fence-drivers/cmd/fence-driver"},
}

// Reference renders the generated part of the page from each program's -h output.
func Reference(helps map[string]string) (string, error) {
	var b strings.Builder
	for _, p := range Programs {
		flags := ParseHelp(helps[p.Name])
		if len(flags) == 0 {
			return "", fmt.Errorf("%s -h printed no flags:\n%s", p.Name, helps[p.Name])
		}
		fmt.Fprintf(&b, "\n### %s\n\nAs `%s -h` prints them:\n\n", p.Name, p.Name)
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

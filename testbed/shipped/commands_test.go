package shipped

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	commandLineRE = regexp.MustCompile(`^  ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?\b`)
	valueFlagRE   = regexp.MustCompile(`(?m)(?:^\s+-|\[--)([a-z][a-z0-9-]*) ([a-z]+)`)
	bracketsRE    = regexp.MustCompile(`\[[^\]]*\]`)
	verbRE        = regexp.MustCompile(`^[a-z][a-z-]*(?:\|[a-z][a-z-]*)*$`)
	goPathRE      = regexp.MustCompile(`\bgo (?:test|run|build|vet|list)\b[^;&|]*`)
)

// verbs are the commands of a program with commands, read from its help: fencectl lists every
// command ("config show" for a group's), nodefence-testbed names them in its usage lines.
type verbs struct {
	cmds   map[string]bool // "fence", "config", "config show", ...
	groups map[string]bool // commands that take a sub-command: config, maintenance
	values map[string]bool // flags that take a value, so the word after them is not a command
}

func verbsOf(prog, help string) verbs {
	v := verbs{cmds: map[string]bool{}, groups: map[string]bool{}, values: map[string]bool{}}
	for _, m := range valueFlagRE.FindAllStringSubmatch(help, -1) {
		v.values["--"+m[1]] = true
	}
	inCommands := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " "):
			inCommands = line == "commands:"
		case inCommands:
			if m := commandLineRE.FindStringSubmatch(line); m != nil {
				v.cmds[m[1]] = true
				if m[2] != "" {
					v.groups[m[1]], v.cmds[m[1]+" "+m[2]] = true, true
				}
			}
		}
		trimmed := strings.TrimSpace(strings.TrimPrefix(line, "usage:"))
		if usage, ok := strings.CutPrefix(trimmed, prog+" "); ok { // a usage line
			for _, w := range strings.Fields(bracketsRE.ReplaceAllString(usage, "")) {
				for _, c := range strings.Split(w, "|") {
					if c != "" && strings.ToLower(c) == c && !strings.HasPrefix(c, "-") {
						v.cmds[c] = true
					}
				}
			}
		}
	}
	return v
}

// words returns the words after the program's name that are neither flags, their values, variables
// nor elisions: the command and its arguments.
func (v verbs) words(after []string) []string {
	var out []string
	for i := 0; i < len(after); i++ {
		w := after[i]
		switch {
		case strings.HasPrefix(w, "-"):
			if !strings.Contains(w, "=") && v.values["--"+strings.TrimLeft(w, "-")] {
				i++
			}
		case strings.HasPrefix(w, "$") || w == "…" || w == "...":
		default:
			out = append(out, w)
		}
	}
	return out
}

// placeholder says whether a word stands for something (NODE, [ID], <name>) rather than naming it.
func placeholder(w string) bool {
	return strings.ToLower(w) != w || strings.ContainsAny(w, "[<{'\"") || w == ""
}

// check returns the commands a command line names that the program does not have.
func (v verbs) check(after []string) []string {
	ws := v.words(after)
	if len(ws) == 0 || !verbRE.MatchString(strings.TrimRight(ws[0], ",.;:)")) {
		return nil // not a command line: prose, or a placeholder such as COMMAND
	}
	var bad []string
	for _, c := range strings.Split(strings.TrimRight(ws[0], ",.;:)"), "|") {
		if !v.cmds[c] {
			bad = append(bad, c)
			continue
		}
		if !v.groups[c] || len(ws) < 2 || placeholder(ws[1]) {
			continue
		}
		for _, sub := range strings.Split(strings.TrimRight(ws[1], ",.;:)"), "|") {
			if !v.cmds[c+" "+sub] {
				bad = append(bad, c+" "+sub)
			}
		}
	}
	return bad
}

// Every command the README and docs/ give fencectl or nodefence-testbed is one of theirs, and every
// package path they give `go test`/`go run` exists.
func TestReadmeCommandsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	texts, err := helps()
	if err != nil {
		t.Fatal(err)
	}
	progs := map[string]verbs{}
	for _, p := range []string{"fencectl", "nodefence-testbed"} {
		if progs[p] = verbsOf(p, texts[p]); len(progs[p].cmds) < 3 {
			t.Fatalf("%s: only %v in its help: the extraction is broken", p, progs[p].cmds)
		}
	}
	checked := 0
	for _, sn := range readme(t) {
		words := strings.Fields(sn.code)
		for i, w := range words {
			v, ok := progs[programOf(w)]
			if !ok {
				continue
			}
			checked++
			for _, bad := range v.check(words[i+1:]) {
				t.Errorf("%s: %q names the command %q, which %s does not have", sn.file, sn.code, bad, programOf(w))
			}
			break
		}
		for _, m := range goPathRE.FindAllString(sn.code, -1) {
			for _, w := range strings.Fields(m) {
				if w = strings.TrimRight(w, ",;:)"); strings.HasPrefix(w, "./") {
					if _, err := os.Stat(filepath.Join(root(t), strings.TrimSuffix(w, "/..."))); err != nil {
						t.Errorf("%s: %q names %s, which does not exist", sn.file, sn.code, w)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d command lines of fencectl or nodefence-testbed found: the extraction is broken", checked)
	}
}

// Package baremetal reads the systemd units of deploy/systemd as systemd does — sections,
// continuation lines, EnvironmentFile=, the %i specifier and ${VAR} / $VAR expansion in ExecStart=
// — so a test can start the exact command line a host would run.
package baremetal

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Unit is the [Service] part of a unit file that decides what runs.
type Unit struct {
	// ExecStart is the raw command line, continuation lines joined.
	ExecStart string
	// EnvironmentFiles are the EnvironmentFile= paths; a leading "-" (optional file) is kept.
	EnvironmentFiles []string
	// Service holds every key of [Service] (the last value of a repeated key).
	Service map[string]string
}

// ReadUnit parses a unit file.
func ReadUnit(path string) (*Unit, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	u := &Unit{Service: map[string]string{}}
	section := ""
	var logical []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";")) {
			continue
		}
		if cur.Len() > 0 && (strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";")) {
			continue // systemd skips comment lines inside a continued value
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		logical = append(logical, cur.String())
	}
	for _, l := range logical {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]") {
			section = l[1 : len(l)-1]
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("%s: line %q is not key=value", path, l)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if section != "Service" {
			continue
		}
		u.Service[k] = v
		switch k {
		case "ExecStart":
			u.ExecStart = v
		case "EnvironmentFile":
			u.EnvironmentFiles = append(u.EnvironmentFiles, v)
		}
	}
	if u.ExecStart == "" {
		return nil, fmt.Errorf("%s: no ExecStart= in [Service]", path)
	}
	return u, nil
}

// Specifiers replaces %i (the instance) and %% in s, as systemd does for an instance unit.
func Specifiers(s, instance string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 == len(s) {
			return "", fmt.Errorf("trailing %% in %q", s)
		}
		i++
		switch s[i] {
		case 'i':
			b.WriteString(instance)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("specifier %%%c in %q is not supported here", s[i], s)
		}
	}
	return b.String(), nil
}

// ReadEnvFile parses an EnvironmentFile: KEY=VALUE lines, # and ; comments, values optionally in
// double or single quotes.
func ReadEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: %q is not KEY=VALUE", path, n+1, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	return env, nil
}

// CommandLine splits an ExecStart= value into words and expands variables as systemd does: a word
// that is exactly $VAR becomes the value split at whitespace (zero or more words); ${VAR} anywhere
// becomes the value as it is, inside its word. An unset variable is an error here (systemd would
// expand it to nothing, which for a unit meant to be filled in is a mistake).
func CommandLine(execStart string, env map[string]string) ([]string, error) {
	words, err := splitWords(execStart)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range words {
		if strings.HasPrefix(w, "$") && !strings.HasPrefix(w, "${") && isName(w[1:]) {
			v, ok := env[w[1:]]
			if !ok {
				return nil, fmt.Errorf("$%s is not set", w[1:])
			}
			out = append(out, strings.Fields(v)...)
			continue
		}
		var b strings.Builder
		for {
			i := strings.Index(w, "${")
			if i < 0 {
				b.WriteString(w)
				break
			}
			j := strings.IndexByte(w[i:], '}')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ${ in %q", w)
			}
			name := w[i+2 : i+j]
			v, ok := env[name]
			if !ok {
				return nil, fmt.Errorf("${%s} is not set", name)
			}
			b.WriteString(w[:i])
			b.WriteString(v)
			w = w[i+j+1:]
		}
		out = append(out, b.String())
	}
	return out, nil
}

func isName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// splitWords splits at unquoted whitespace; double and single quotes group words.
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '"' || c == '\'':
			quote, inWord = c, true
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
)

// The config commands that keep fencectl's own settings: contexts in the settings file
// (settings.go), like kubectl's. They never call the coordinator.

const setContextHelp = `Writes the global flags given on this line into context NAME of the settings file, keeping the
context's other settings (certificate paths are stored absolute). The first context written becomes
the current one. The settings a context may hold are the flags --coordinator, --tls-cert,
--tls-key, --tls-ca, --tls-server-name, --insecure, --timeout, --per-address-timeout and -o.
Example:

  fencectl config set-context prod --coordinator c1:7001,c2:7001,c3:7001 \
      --tls-cert alice.crt --tls-key alice.key --tls-ca ca.crt
  fencectl nodes                     # uses prod: no flags needed
  NODEFENCE_TIMEOUT=5m fencectl fence node-7 --context lab`

func setContextSetup(*flag.FlagSet) runFunc {
	return func(_ context.Context, c *ctl, a []string) error { return c.setContext(a[0]) }
}

func useContextSetup(*flag.FlagSet) runFunc {
	return func(_ context.Context, c *ctl, a []string) error { return c.useContext(a[0]) }
}

func getContextsSetup(*flag.FlagSet) runFunc {
	return func(_ context.Context, c *ctl, _ []string) error { return c.getContexts() }
}

func viewSetup(*flag.FlagSet) runFunc {
	return func(_ context.Context, c *ctl, _ []string) error { return c.viewSettings() }
}

// openSettings returns the settings file's path and contents.
func (c *ctl) openSettings() (string, *settingsFile, bool, error) {
	path, err := settingsPath(c.getenv)
	if err != nil {
		return "", nil, false, usagef("%v", err)
	}
	f, exists, err := loadSettings(path)
	if err != nil {
		return "", nil, false, fmt.Errorf("settings file %w", err)
	}
	return path, f, exists, nil
}

// setContext writes the settings given as flags into context name.
func (c *ctl) setContext(name string) error {
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return usagef("NAME: %q is not a context name (no blanks)", name)
	}
	var keys []string
	for _, key := range settingNames {
		if c.given[key] || (key == "output" && (c.given["o"] || c.given["json"])) {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return usagef("give the settings as flags, for example --coordinator ADDR --tls-cert F --tls-key F --tls-ca F")
	}
	path, f, _, err := c.openSettings()
	if err != nil {
		return err
	}
	if f.Contexts == nil {
		f.Contexts = map[string]map[string]any{}
	}
	if f.Contexts[name] == nil {
		f.Contexts[name] = map[string]any{}
	}
	for _, key := range keys {
		v := c.fset.Lookup(key).Value.String()
		if slices.Contains(pathSettings, key) && v != "" {
			abs, err := filepath.Abs(v)
			if err != nil {
				return err
			}
			v = abs
		}
		f.Contexts[name][key] = v
	}
	if f.CurrentContext == "" {
		f.CurrentContext = name
	}
	if err := f.save(path); err != nil {
		return err
	}
	return c.show(view{data: object{{"path", path}, {"context", name}, {"set", keys}, {"currentContext", f.CurrentContext}},
		text: func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "context %s in %s: set %s; current context: %s\n", name, path, strings.Join(keys, ", "), f.CurrentContext)
			return err
		}})
}

// useContext makes name the file's current context.
func (c *ctl) useContext(name string) error {
	path, f, exists, err := c.openSettings()
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("%s does not exist: write a context first with fencectl config set-context", path)
	}
	if f.Contexts[name] == nil {
		return fmt.Errorf("no context %q in %s%s", name, path, didYouMean(name, contextNames(f)))
	}
	f.CurrentContext = name
	if err := f.save(path); err != nil {
		return err
	}
	return c.show(view{data: object{{"path", path}, {"currentContext", name}}, text: func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "current context: %s (%s)\n", name, path)
		return err
	}})
}

func contextNames(f *settingsFile) []string {
	names := make([]string, 0, len(f.Contexts))
	for n := range f.Contexts {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// getContexts lists the contexts, the current one marked.
func (c *ctl) getContexts() error {
	path, f, _, err := c.openSettings()
	if err != nil {
		return err
	}
	t := table{header: []string{"CURRENT", "NAME", "COORDINATOR", "CERTIFICATE", "OTHER SETTINGS"}}
	for _, name := range contextNames(f) {
		cur := ""
		if name == f.CurrentContext {
			cur = "*"
		}
		var other []string
		for _, key := range settingNames {
			if v, ok := f.Contexts[name][key]; ok && key != "coordinator" && key != "tls-cert" {
				other = append(other, fmt.Sprintf("%s=%v", key, v))
			}
		}
		coord, _ := f.value(path, name, "coordinator")
		cert, _ := f.value(path, name, "tls-cert")
		t.rows = append(t.rows, []string{cur, name, orDash(coord), orDash(cert), strings.Join(other, " ")})
	}
	if len(t.rows) == 0 {
		t.notes = append(t.notes, "no contexts in "+path+" (fencectl config set-context NAME --coordinator ADDR ...)")
	}
	return c.show(view{data: object{{"path", path}, {"currentContext", f.CurrentContext}, {"contexts", f.Contexts}}, tables: []table{t}})
}

// viewSettings shows the global settings in force for a command given on this line, and where
// each comes from.
func (c *ctl) viewSettings() error {
	if err := c.applySettings(c.fset, c.given); err != nil {
		return err
	}
	path, err := settingsPath(c.getenv)
	if err != nil {
		return usagef("%v", err)
	}
	t := table{title: fmt.Sprintf("settings file %s, context %s:", path, orDash(c.contextUsed)), header: []string{"FLAG", "VALUE", "FROM"}}
	values := object{}
	for _, key := range settingNames {
		v := c.fset.Lookup(key).Value.String()
		from := c.settingsFrom[key]
		if from == "" {
			from = "default"
		}
		t.rows = append(t.rows, []string{"--" + key, v, from})
		values = append(values, member{key, object{{"value", v}, {"from", from}}})
	}
	return c.show(view{data: object{{"path", path}, {"context", c.contextUsed}, {"settings", values}}, tables: []table{t}})
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// fencectl's settings come from four places; the first that has a setting wins:
//
//  1. a flag on the command line (--coordinator, --tls-ca, ...);
//  2. its environment variable, NODEFENCE_ and the flag's name in capitals with "_" for "-"
//     (NODEFENCE_COORDINATOR, NODEFENCE_TLS_CA, ...);
//  3. the current context of the settings file (contexts.NAME.coordinator, ...; the keys are the
//     flags' names); --context or NODEFENCE_CONTEXT choose another context than current-context;
//  4. the flag's default.
//
// The settings file is $NODEFENCE_CONFIG, else $XDG_CONFIG_HOME/nodefence/config, else
// ~/.config/nodefence/config. A relative certificate path in it is relative to the file.

// Environment variables besides the settings'.
const (
	envConfig  = "NODEFENCE_CONFIG"
	envContext = "NODEFENCE_CONTEXT"
)

// settingNames are the global flags a context or an environment variable may set, in the order
// help and get-contexts list them.
var settingNames = []string{"coordinator", "tls-cert", "tls-key", "tls-ca", "tls-server-name", "insecure", "timeout", "per-address-timeout", "output"}

// pathSettings hold file names: relative ones in the settings file are relative to the file.
var pathSettings = []string{"tls-cert", "tls-key", "tls-ca"}

// envName is the environment variable of a setting: tls-ca -> NODEFENCE_TLS_CA.
func envName(setting string) string {
	return "NODEFENCE_" + strings.ToUpper(strings.ReplaceAll(setting, "-", "_"))
}

// settingsFile is fencectl's settings file: named contexts, each a set of global flags' values,
// and the context used when none is named.
type settingsFile struct {
	// CurrentContext is the context used unless --context or NODEFENCE_CONTEXT names another.
	CurrentContext string `json:"current-context,omitempty"`
	// Contexts are the settings of each context by name, keyed by the flags' names.
	Contexts map[string]map[string]any `json:"contexts,omitempty"`
}

// settingsPath is where the settings file is, from the environment.
func settingsPath(getenv func(string) string) (string, error) {
	if p := getenv(envConfig); p != "" {
		return p, nil
	}
	if x := getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "nodefence", "config"), nil
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "nodefence", "config"), nil
	}
	return "", fmt.Errorf("no settings file: set %s or HOME", envConfig)
}

// loadSettings reads and checks the settings file at path; a missing file is an empty one
// (exists false). Every problem is reported, each naming its key.
func loadSettings(path string) (f *settingsFile, exists bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &settingsFile{}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	f = &settingsFile{}
	if err := yaml.UnmarshalStrict(b, f); err != nil {
		return nil, true, fmt.Errorf("%s: %w", path, err)
	}
	var problems []string
	names := make([]string, 0, len(f.Contexts))
	for name := range f.Contexts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if name == "" {
			problems = append(problems, "contexts: a context has an empty name")
		}
		for key, v := range f.Contexts[name] {
			switch {
			case !slices.Contains(settingNames, key):
				problems = append(problems, fmt.Sprintf("contexts.%s.%s: not a setting%s; one of %s", name, key, didYouMean(key, settingNames), strings.Join(settingNames, ", ")))
			case !scalar(v):
				problems = append(problems, fmt.Sprintf("contexts.%s.%s: want a single value, got %v", name, key, v))
			}
		}
	}
	if c := f.CurrentContext; c != "" && f.Contexts[c] == nil {
		problems = append(problems, fmt.Sprintf("current-context: no context %q%s", c, didYouMean(c, names)))
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return nil, true, fmt.Errorf("%s: %s", path, strings.Join(problems, "; "))
	}
	return f, true, nil
}

func scalar(v any) bool {
	switch v.(type) {
	case string, bool, float64, int64, int:
		return true
	}
	return false
}

// value is a context's setting as flag text, a relative path made relative to the file's folder.
func (f *settingsFile) value(path, context, key string) (string, bool) {
	v, ok := f.Contexts[context][key]
	if !ok {
		return "", false
	}
	s := fmt.Sprint(v)
	if slices.Contains(pathSettings, key) && s != "" && !filepath.IsAbs(s) {
		s = filepath.Join(filepath.Dir(path), s)
	}
	return s, true
}

// save writes the file at path (0600: it names the operator's key), through a temporary file so
// that an interrupted write never leaves half a file.
func (f *settingsFile) save(path string) error {
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp.%d", path, os.Getpid())
	head := "# fencectl's settings: contexts of the global flags (fencectl help config).\n"
	if err := os.WriteFile(tmp, append([]byte(head), b...), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// applySettings gives every setting the command line did not set its environment variable's value,
// else the chosen context's; set names the flags given on the command line. It records in c where
// the settings came from. A wrong value is a usage error naming its variable or key.
func (c *ctl) applySettings(fset *flag.FlagSet, set map[string]bool) error {
	path, err := settingsPath(c.getenv)
	if err != nil {
		return usagef("%v", err)
	}
	file, exists, err := loadSettings(path)
	if err != nil {
		return usagef("settings file %v", err)
	}
	name, from := c.contextName(set, file)
	if name != "" && file.Contexts[name] == nil {
		names := make([]string, 0, len(file.Contexts))
		for n := range file.Contexts {
			names = append(names, n)
		}
		slices.Sort(names)
		where := "in " + path
		if !exists {
			where = path + " does not exist"
		}
		return usagef("%s: no context %q (%s)%s", from, name, where, didYouMean(name, names))
	}
	c.contextUsed, c.settingsFrom = name, map[string]string{}
	for _, key := range settingNames {
		if set[key] || (key == "output" && (set["o"] || set["json"])) {
			c.settingsFrom[key] = "flag"
			continue
		}
		if v := c.getenv(envName(key)); v != "" {
			if err := fset.Set(key, v); err != nil {
				return usagef("%s: %v", envName(key), err)
			}
			c.settingsFrom[key] = envName(key)
			continue
		}
		if v, ok := file.value(path, name, key); ok && name != "" {
			if err := fset.Set(key, v); err != nil {
				return usagef("context %s in %s: %s: %v", name, path, key, err)
			}
			c.settingsFrom[key] = "context " + name
		}
	}
	return nil
}

// contextName is the context to use and what chose it: --context, NODEFENCE_CONTEXT, or the
// file's current-context ("" when none).
func (c *ctl) contextName(set map[string]bool, file *settingsFile) (name, from string) {
	switch {
	case set["context"]:
		return c.context, "--context"
	case c.getenv(envContext) != "":
		return c.getenv(envContext), envContext
	}
	return file.CurrentContext, "current-context"
}

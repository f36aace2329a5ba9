package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain keeps the tests that call run from the machine's own settings: no settings file, no
// NODEFENCE_* variables.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "NODEFENCE_") {
			os.Unsetenv(k)
		}
	}
	home, err := os.MkdirTemp("", "fencectl-home")
	if err != nil {
		panic(err)
	}
	os.Setenv("HOME", home)
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	code := m.Run()
	os.RemoveAll(home)
	os.Exit(code)
}

// runIn runs fencectl with env as its whole environment.
func runIn(env map[string]string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := runEnv(context.Background(), args, &out, &errb, func(k string) string { return env[k] })
	return code, out.String(), errb.String()
}

// A flag wins over its NODEFENCE_* variable, which wins over the settings file's context, which
// wins over the default; --context and NODEFENCE_CONTEXT choose the context; relative certificate
// paths are relative to the file; config view says where each setting came from.
func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nodefence", "config")
	env := map[string]string{"HOME": dir}
	// set-context writes the global flags given, absolute; the first context becomes current.
	if code, out, errOut := runIn(env, "config", "set-context", "prod", "--coordinator", "p1:7001,p2:7001", "--tls-ca", "ca.crt", "--timeout", "5m"); code != 0 ||
		!strings.Contains(out, "current context: prod") {
		t.Fatalf("set-context prod: exit %d\n%s%s", code, out, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, ".config", "nodefence", "config"))
	if err != nil {
		t.Fatal(err)
	}
	cwd, _ := os.Getwd()
	if !strings.Contains(string(b), filepath.Join(cwd, "ca.crt")) {
		t.Errorf("set-context did not store the CA path absolute:\n%s", b)
	}
	// A hand-written file with a relative path, named by NODEFENCE_CONFIG.
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(`current-context: prod
contexts:
  prod: {coordinator: "p1:7001", tls-ca: certs/ca.crt, tls-cert: /abs/alice.crt, timeout: 5m, insecure: false}
  lab: {coordinator: "127.0.0.1:7001", insecure: true}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env = map[string]string{"HOME": dir, "NODEFENCE_CONFIG": file}
	view := func(extraEnv map[string]string, args ...string) map[string][2]string {
		t.Helper()
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range extraEnv {
			e[k] = v
		}
		code, out, errOut := runIn(e, append([]string{"config", "view", "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("config view %q: exit %d\n%s%s", args, code, out, errOut)
		}
		var v struct {
			Settings map[string]struct{ Value, From string }
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		got := map[string][2]string{}
		for k, s := range v.Settings {
			got[k] = [2]string{s.Value, s.From}
		}
		return got
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want map[string][2]string
	}{
		{"context", nil, nil, map[string][2]string{
			"coordinator": {"p1:7001", "context prod"}, "tls-ca": {filepath.Join(dir, "nodefence", "certs/ca.crt"), "context prod"},
			"tls-cert": {"/abs/alice.crt", "context prod"}, "timeout": {"5m0s", "context prod"}, "per-address-timeout": {"10s", "default"}}},
		{"env over context", map[string]string{"NODEFENCE_COORDINATOR": "e1:7001", "NODEFENCE_TIMEOUT": "7s"}, nil, map[string][2]string{
			"coordinator": {"e1:7001", "NODEFENCE_COORDINATOR"}, "timeout": {"7s", "NODEFENCE_TIMEOUT"}, "tls-cert": {"/abs/alice.crt", "context prod"}}},
		{"flag over env", map[string]string{"NODEFENCE_COORDINATOR": "e1:7001"}, []string{"--coordinator", "f1:7001"}, map[string][2]string{
			"coordinator": {"f1:7001", "flag"}}},
		{"--context", map[string]string{"NODEFENCE_CONTEXT": "prod"}, []string{"--context", "lab"}, map[string][2]string{
			"coordinator": {"127.0.0.1:7001", "context lab"}, "insecure": {"true", "context lab"}, "tls-cert": {"", "default"}}},
		{"NODEFENCE_CONTEXT", map[string]string{"NODEFENCE_CONTEXT": "lab"}, nil, map[string][2]string{
			"coordinator": {"127.0.0.1:7001", "context lab"}}},
	} {
		got := view(tc.env, tc.args...)
		for k, want := range tc.want {
			if got[k] != want {
				t.Errorf("%s: %s = %q, want %q", tc.name, k, got[k], want)
			}
		}
	}
	// use-context changes the current context; get-contexts marks it.
	if code, out, errOut := runIn(env, "config", "use-context", "lab"); code != 0 || !strings.Contains(out, "current context: lab") {
		t.Fatalf("use-context lab: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runIn(env, "config", "get-contexts"); code != 0 || !strings.Contains(out, "*") || strings.Index(out, "*") > strings.Index(out, "lab ") {
		t.Errorf("get-contexts after use-context lab:\n%s", out)
	}
	if got := view(nil); got["coordinator"] != [2]string{"127.0.0.1:7001", "context lab"} {
		t.Errorf("after use-context lab: coordinator %q", got["coordinator"])
	}
}

// Wrong settings are usage errors that name the variable, the context or the key, with a guess.
func TestSettingsErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"NODEFENCE_CONFIG": file}
	write("contexts:\n  prod: {coordinator: \"p1:7001\", tlsca: ca.crt}\n")
	if code, _, errOut := runIn(env, "nodes"); code != 2 || !strings.Contains(errOut, "contexts.prod.tlsca: not a setting") || !strings.Contains(errOut, `did you mean "tls-ca"?`) {
		t.Errorf("unknown key: exit %d, %s", code, errOut)
	}
	write("current-context: prod\ncontexts:\n  prod: {coordinator: \"p1:7001\", timeout: soon}\n")
	if code, _, errOut := runIn(env, "nodes"); code != 2 || !strings.Contains(errOut, "context prod") || !strings.Contains(errOut, "timeout") {
		t.Errorf("bad value in a context: exit %d, %s", code, errOut)
	}
	write("current-context: prod\ncontexts:\n  prod: {coordinator: \"p1:7001\"}\n")
	if code, _, errOut := runIn(env, "nodes", "--context", "prdo"); code != 2 || !strings.Contains(errOut, `no context "prdo"`) || !strings.Contains(errOut, `did you mean "prod"?`) {
		t.Errorf("unknown --context: exit %d, %s", code, errOut)
	}
	env["NODEFENCE_PER_ADDRESS_TIMEOUT"] = "fast"
	if code, _, errOut := runIn(env, "nodes"); code != 2 || !strings.Contains(errOut, "NODEFENCE_PER_ADDRESS_TIMEOUT") {
		t.Errorf("bad variable: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runIn(env, "config", "use-context", "lba"); code == 0 || !strings.Contains(errOut, `no context "lba"`) {
		t.Errorf("use-context of an unknown context: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runIn(env, "config", "set-context", "x"); code != 2 || !strings.Contains(errOut, "give the settings as flags") {
		t.Errorf("set-context without settings: exit %d, %s", code, errOut)
	}
	// Help says the precedence and names the variables.
	code, out, _ := runIn(nil, "--help")
	for _, want := range []string{"wins over its environment variable", "NODEFENCE_COORDINATOR", "(env NODEFENCE_TLS_CA)", "~/.config/nodefence/config"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}

// A typo'd command, subcommand or flag gets the nearest names.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fnece", "n1"}, `unknown command "fnece"; did you mean "fence"?`},
		{[]string{"lsit"}, `did you mean "list"?`},
		{[]string{"conifg", "show"}, `did you mean "config"?`},
		{[]string{"config", "shwo"}, `did you mean "show"?`},
		{[]string{"config", "use-contxt", "x"}, `did you mean "use-context"?`},
		{[]string{"nodes", "--timout", "5s"}, `unknown flag -timout; did you mean "timeout"?`},
		{[]string{"fence", "n1", "--reaso", "x"}, `did you mean "reason"?`},
	} {
		code, _, errOut := runIn(map[string]string{}, append([]string{"--insecure"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("fencectl %q: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, _, errOut := runIn(map[string]string{}, "zzzzzz"); code != 2 || strings.Contains(errOut, "did you mean") {
		t.Errorf("a word near nothing: exit %d, %q", code, errOut)
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"fence", "fence", 0}, {"fnece", "fence", 1}, {"fenc", "fence", 1}, {"lsit", "list", 1}, {"", "abc", 3}, {"abc", "", 3}, {"kitten", "sitting", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}

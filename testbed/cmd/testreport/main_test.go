package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A real `go test -json` of a small module with a passing, a failing, a slow and a skipped test, a
// package that does not build and one that hangs past -timeout: Echo shows what plain `go test`
// shows (the failure with its log, the build error, the timeout's panic with the hung test's log,
// the packages' FAIL and ok lines; not the passing tests' logs), Slowest ranks the top-level tests.
func TestRealGoTestJSON(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"a/a_test.go": `package a
import ("testing"; "time")
func TestPasses(t *testing.T) { t.Log("quiet when passing") }
func TestFails(t *testing.T) { t.Log("shown when failing"); t.Log("time=x level=INFO msg=\"a log\"\n  its tail"); t.Log("log tail:\ntime=y level=INFO msg=\"dumped\""); t.Error("boom\n  second line") }
func TestSlow(t *testing.T) { t.Run("sub", func(t *testing.T) { time.Sleep(300 * time.Millisecond) }) }
func TestSkipped(t *testing.T) { t.Skip("not here") }
`,
		"b/b_test.go": "package b\nimport \"testing\"\nfunc TestB(t *testing.T) {}\n",
		"c/c_test.go": "package c\nimport \"testing\"\nfunc TestC(t *testing.T) { x := 1 }\n",
		"d/d_test.go": "package d\nimport (\"testing\"; \"time\")\nfunc TestHangs(t *testing.T) { t.Log(\"before the hang\"); time.Sleep(time.Minute) }\n",
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-count=1", "-timeout", "2s", "-json", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	raw, err := cmd.Output()
	if err == nil {
		t.Fatal("go test of a failing test succeeded")
	}
	var echo bytes.Buffer
	if err := Echo(bytes.NewReader(raw), &echo); err != nil {
		t.Fatal(err)
	}
	out := echo.String()
	for _, want := range []string{"shown when failing", "boom", "--- FAIL: TestFails", "FAIL\texample.com/m/a", "ok  \texample.com/m/b",
		"declared and not used: x", "FAIL\texample.com/m/c [build failed]", "before the hang", "panic: test timed out after 2s"} {
		if !strings.Contains(out, want) {
			t.Errorf("Echo: no %q in\n%s", want, out)
		}
	}
	for _, not := range []string{"quiet when passing", "=== RUN", "--- PASS", "not here"} {
		if strings.Contains(out, not) {
			t.Errorf("Echo: %q in\n%s", not, out)
		}
	}
	var failures bytes.Buffer
	if err := Failures(bytes.NewReader(raw), &failures, "example.com/m"); err != nil {
		t.Fatal(err)
	}
	f := failures.String()
	for _, want := range []string{"2 failed tests", "--- FAIL: TestFails (a)", "--- FAIL: TestHangs, which did not finish (d)", "before the hang", "log tail:", "shown when failing", "boom", "second line"} {
		if !strings.Contains(f, want) {
			t.Errorf("Failures: no %q in\n%s", want, f)
		}
	}
	for _, not := range []string{"a log", "its tail", "dumped", "TestPasses"} {
		if strings.Contains(f, not) {
			t.Errorf("Failures: %q in\n%s", not, f)
		}
	}
	var slow bytes.Buffer
	if err := Slowest(bytes.NewReader(raw), &slow, 3, "example.com/m"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(slow.String()), "\n")
	if len(lines) != 4 || lines[0] != "the 3 slowest tests:" || !strings.HasSuffix(lines[1], "a TestSlow") || strings.Contains(slow.String(), "sub") {
		t.Fatalf("Slowest:\n%s", slow.String())
	}
}

// Lines that are not JSON (go test's own stderr merged in, a tool's message) are shown, not lost.
func TestEchoPassesNonJSON(t *testing.T) {
	var out bytes.Buffer
	in := "not json\n" + `{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}` + "\n"
	if err := Echo(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "not json\nok  \tp\t0.1s\n" {
		t.Fatalf("Echo: %q", out.String())
	}
}

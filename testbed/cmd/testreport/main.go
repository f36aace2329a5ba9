// Command testreport is what `make test` shows of `go test -json`: without -slowest it reads the
// JSON events on stdin and prints what `go test` prints without -json (each package's ok or FAIL
// line, the output of failing tests, build errors), so the terminal reads as before while the events
// are kept; with -slowest N it reads the same events and prints the N slowest top-level tests.
// Its exit code is go test's business: it exits non-zero only when it cannot read its input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	slowest := flag.Int("slowest", 0, "print the N slowest top-level tests instead of the output")
	module := flag.String("module", "github.com/nodefence/nodefence", "module path left out of package names")
	flag.Parse()
	var err error
	if *slowest > 0 {
		err = Slowest(os.Stdin, os.Stdout, *slowest, *module)
	} else {
		err = Echo(os.Stdin, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

// Event is one line of `go test -json` (cmd/test2json), with the fields used here.
type Event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// events calls fn for each event in r. A line that is not JSON is passed on as output of no test:
// nothing go test says is lost.
func events(r io.Reader, fn func(Event)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fn(Event{Action: "output", Output: sc.Text() + "\n"})
			continue
		}
		fn(e)
	}
	return sc.Err()
}

// Echo prints what go test prints without -json: package-level output (ok, FAIL, panics, build
// errors) at once, a test's output only when the test fails.
func Echo(r io.Reader, w io.Writer) error {
	held := map[string][]string{} // package + test -> its output so far
	err := events(r, func(e Event) {
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Action == "output" && e.Test == "":
			if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(w, e.Output)
			}
		case e.Action == "output":
			held[key] = append(held[key], e.Output)
		case e.Action == "fail" && e.Test != "":
			printFailure(w, held[key])
			delete(held, key)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, key)
		}
		if e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
			unfinished(w, held, e.Package+"\x00")
		}
	})
	unfinished(w, held, "")
	return err
}

// unfinished prints and forgets the held output of the tests under prefix that never ended (a
// timeout's panic, a crash): go test prints it as it comes.
func unfinished(w io.Writer, held map[string][]string, prefix string) {
	var keys []string
	for key := range held {
		if strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Fprintf(w, "(output of %s, which did not finish)\n", strings.ReplaceAll(key, "\x00", " "))
		printFailure(w, held[key])
		delete(held, key)
	}
}

// printFailure prints a failed test's output as go test does: its "--- FAIL" line (which test2json
// reports last) first, then what it logged; the "=== RUN" lines of -v left out.
func printFailure(w io.Writer, lines []string) {
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "--- ") {
			fmt.Fprint(w, line)
		}
	}
	for _, line := range lines {
		if t := strings.TrimSpace(line); !strings.HasPrefix(t, "--- ") && !strings.HasPrefix(t, "=== ") {
			fmt.Fprint(w, line)
		}
	}
}

// Result is one top-level test's outcome and duration.
type Result struct {
	Package, Test, Action string
	Elapsed               float64
}

// Slowest prints the n slowest top-level tests that finished (passed, failed or skipped).
func Slowest(r io.Reader, w io.Writer, n int, module string) error {
	var results []Result
	err := events(r, func(e Event) {
		if e.Test != "" && !strings.Contains(e.Test, "/") && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
			results = append(results, Result{e.Package, e.Test, e.Action, e.Elapsed})
		}
	})
	if err != nil {
		return err
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].Elapsed > results[j].Elapsed })
	if len(results) > n {
		results = results[:n]
	}
	fmt.Fprintf(w, "the %d slowest tests:\n", len(results))
	for _, res := range results {
		pkg := strings.TrimPrefix(strings.TrimPrefix(res.Package, module), "/")
		if pkg == "" {
			pkg = "."
		}
		note := ""
		if res.Action != "pass" {
			note = " (" + res.Action + ")"
		}
		fmt.Fprintf(w, "  %8.1fs  %s %s%s\n", res.Elapsed, pkg, res.Test, note)
	}
	return nil
}

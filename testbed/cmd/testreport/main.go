// Command testreport is what `make test` shows of `go test -json`: without -slowest it reads the
// JSON events on stdin and prints what `go test` prints without -json (each package's ok or FAIL
// line, the output of failing tests, build errors), so the terminal reads as before while the events
// are kept; with -slowest N it reads the same events and prints the N slowest top-level tests.
// With -failures it prints, for each failed test, only the test's own messages (t.Error, t.Fatal,
// t.Log lines, not the logs of the programs it runs), so that the end of a long run names what failed
// and why even when its full output is cut. Its exit code is go test's business: it exits non-zero only when it cannot read its input.
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
	failures := flag.Bool("failures", false, "print each failed test's own messages (not its logs) instead of the output")
	module := flag.String("module", "github.com/nodefence/nodefence", "module path left out of package names")
	flag.Parse()
	var err error
	switch {
	case *slowest > 0:
		err = Slowest(os.Stdin, os.Stdout, *slowest, *module)
	case *failures:
		err = Failures(os.Stdin, os.Stdout, *module)
	default:
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

// maxMessages is how many of a failed test's own messages Failures keeps (its last ones: the
// failure is usually the last thing a test says).
const maxMessages = 12

// maxMessageLines is how many lines of one message Failures keeps (a dumped log is cut).
const maxMessageLines = 6

// Failures prints, after a line naming their count, each failed test with its last maxMessages own
// messages: a message starts at a "file.go:line: " prefix and runs over its indented continuation
// lines; lines of structured logs (slog's "level=") are left out, as is everything of passing tests.
func Failures(r io.Reader, w io.Writer, module string) error {
	type failed struct{ name, pkg string }
	held := map[string][][]string{} // package + test -> its messages so far
	var order []failed
	var msgs [][][]string
	err := events(r, func(e Event) {
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Test == "" && e.Action == "fail":
			// A package that failed with tests still running (a timeout, a crash): name them, in
			// order, with what they said.
			var hung []string
			for k := range held {
				if pkg, test, _ := strings.Cut(k, "\x00"); pkg == e.Package && !strings.Contains(test, "/") {
					hung = append(hung, k)
				}
			}
			sort.Strings(hung)
			for _, k := range hung {
				pkg, test, _ := strings.Cut(k, "\x00")
				order = append(order, failed{test + ", which did not finish", strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")})
				msgs = append(msgs, ownMessages(held[k]))
				delete(held, k)
			}
		case e.Test == "":
		case e.Action == "output":
			held[key] = addMessage(held[key], e.Output)
		case e.Action == "fail":
			pkg := strings.TrimPrefix(strings.TrimPrefix(e.Package, module), "/")
			order = append(order, failed{e.Test, pkg})
			msgs = append(msgs, ownMessages(held[key]))
			delete(held, key)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, key)
		}
	})
	if err != nil || len(order) == 0 {
		return err
	}
	fmt.Fprintf(w, "%d failed tests, with their own messages:\n", len(order))
	for i, f := range order {
		fmt.Fprintf(w, "--- FAIL: %s (%s)\n", f.name, f.pkg)
		m := msgs[i]
		if len(m) > maxMessages {
			m = m[len(m)-maxMessages:]
		}
		for _, msg := range m {
			for _, line := range msg {
				fmt.Fprint(w, line)
			}
		}
	}
	return nil
}

// ownMessages leaves out the places of the log lines addMessage kept out (nil).
func ownMessages(msgs [][]string) [][]string {
	var own [][]string
	for _, m := range msgs {
		if m != nil {
			own = append(own, m)
		}
	}
	return own
}

// addMessage adds one output line of a test to its messages: a "name.go:N: " line starts one (unless
// it is a structured log line), an indented line continues the last one (up to maxMessageLines, and
// never a structured log line a test dumped), anything else is dropped.
func addMessage(msgs [][]string, line string) [][]string {
	t := strings.TrimLeft(line, " \t")
	switch {
	case strings.HasPrefix(t, "--- ") || strings.HasPrefix(t, "=== "):
		return msgs
	case isMessageStart(t):
		if strings.Contains(t, " level=") {
			return append(msgs, nil) // a log line: ends the message before it, kept out
		}
		return append(msgs, []string{line})
	case len(msgs) > 0 && msgs[len(msgs)-1] != nil && len(t) < len(line) && !strings.Contains(t, " level=") &&
		len(msgs[len(msgs)-1]) < maxMessageLines:
		msgs[len(msgs)-1] = append(msgs[len(msgs)-1], line)
	}
	return msgs
}

// isMessageStart says whether t begins as testing prints a message: "name.go:123: ".
func isMessageStart(t string) bool {
	file, rest, ok := strings.Cut(t, ".go:")
	if !ok || file == "" || strings.ContainsAny(file, " \t") {
		return false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	return n > 0 && strings.HasPrefix(rest[n:], ": ")
}

package coordinator

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// allowances name the files (or directories, ending in /) that may make a kind of call: how many
// times (-1: any), and why.
type allowances map[string]struct {
	n   int
	why string
}

// clockReadings are the calls that read the machine's clock directly. Taking time.Now as a value is
// how a clock is constructed (a nil Now defaulting to time.Now) and is allowed.
var clockReadings = map[string][]string{
	"time": {"Now", "Since", "Until"},
	"google.golang.org/protobuf/types/known/timestamppb": {"Now"},
	"k8s.io/apimachinery/pkg/apis/meta/v1":               {"Now"},
}

// clockAllowed are the files that may read the machine's clock, how often, and why. Every other
// reading goes through the injected clock (app.Config.Now, api.Deps.Now, loop.Config.Now,
// fencing.Runner.Now, kdump.Listener.Now, the kube Options' Now).
var clockAllowed = allowances{
	"etcdembed/pki.go":   {4, "certificate validity is checked by TLS peers against the machine's clock"},
	"leader/leader.go":   {3, "measures real time since etcd last answered against the lease TTL, which etcd counts on its real clock: a fake clock must never keep a deposed leader acting"},
	"leader/follower.go": {3, "ages the cached leader view against the election's real lease"},
	// A directory (ending in /) allows any count in its files.
	"cmd/fencectl/": {-1, "a client, not the coordinator: shows ages (a node's last contact) on the operator's machine"},
}

// machineWaits are the calls that wait on the machine's timers directly. A part that decides by the
// injected clock waits on it too (services/clock: app.Config.After, loop.Config.After,
// fencing.Runner.After, the job groups' timers), or a test that moves the clock sees it wake by
// the machine's time and decide by its own.
var machineWaits = map[string][]string{
	"time": {"After", "AfterFunc", "Sleep", "NewTimer", "Tick"},
}

// waitAllowed are the files that may wait on the machine's timers, how often, and why.
var waitAllowed = allowances{
	"etcdembed/etcdembed.go": {1, "bounds the embedded etcd's start (ready, or given up after 60 s) before any clock is wired: no decision waits on it"},
	"api/agentserver.go":     {1, "bounds how long a stream may hold the server before its hello: a limit on a caller's resources, not a decision"},
	"store/registration.go":  {2, "gathers agents' registrations into one etcd write over milliseconds of the machine: batching, not a decision"},
	"cmd/fencectl/":          {-1, "a client, not the coordinator: polls the coordinator on the operator's machine"},
}

// allowanceIn returns the entry of allowed for path: its file's, or its directory's.
func allowanceIn(allowed allowances, path string) (key string, n int, why string, ok bool) {
	for k, a := range allowed {
		if k == path || (strings.HasSuffix(k, "/") && strings.HasPrefix(path, k)) {
			return k, a.n, a.why, true
		}
	}
	return "", 0, "", false
}

// TestOneClock keeps direct readings of the machine's clock out of the coordinator's non-test code:
// one reading by the machine's clock and another by an injected one would judge a node by one clock
// and stamp its inputs by another.
func TestOneClock(t *testing.T) {
	checkCalls(t, clockReadings, clockAllowed, "reads the machine's clock; use the injected clock")
}

// TestOneClockToWaitOn keeps direct waits on the machine's timers out of the coordinator's non-test
// code: a part that decides by the injected clock and waits on the machine's would, under a moved
// clock, wake by one time and decide by another.
func TestOneClockToWaitOn(t *testing.T) {
	checkCalls(t, machineWaits, waitAllowed, "waits on the machine's timers; wait on the injected clock (services/clock)")
}

// checkCalls fails for every non-test file that calls one of calls beyond what allowed grants it.
func checkCalls(t *testing.T, calls map[string][]string, allowed allowances, fix string) {
	t.Helper()
	found := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		got, err := callsIn(path, calls)
		found[filepath.ToSlash(path)] = got
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 30 {
		t.Fatalf("only %d files walked: is the test running in coordinator/?", len(found))
	}
	used := map[string]bool{}
	for path, got := range found {
		key, n, why, ok := allowanceIn(allowed, path)
		used[key] = used[key] || ok
		switch {
		case len(got) > 0 && !ok:
			t.Errorf("%s %s:\n  %s", path, fix, strings.Join(got, "\n  "))
		case ok && n >= 0 && len(got) != n:
			t.Errorf("%s makes %d such calls, %d allowed (%s); keep the allowance exact:\n  %s",
				path, len(got), n, why, strings.Join(got, "\n  "))
		}
	}
	for key := range allowed {
		if !used[key] {
			t.Errorf("the allowance names %s, which holds no Go file", key)
		}
	}
}

// callsIn lists the file's calls of calls (package path to function names), resolving import names.
func callsIn(path string, calls map[string][]string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	imports := map[string]string{}
	for _, spec := range f.Imports {
		p, _ := strconv.Unquote(spec.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if spec.Name != nil {
			name = spec.Name.Name
		}
		imports[name] = p
	}
	var got []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		for _, fn := range calls[imports[pkg.Name]] {
			if sel.Sel.Name == fn {
				got = append(got, fmt.Sprintf("%s: %s.%s()", fset.Position(call.Pos()), pkg.Name, fn))
			}
		}
		return true
	})
	return got, nil
}

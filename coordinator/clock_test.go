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
var clockAllowed = map[string]struct {
	n   int
	why string
}{
	"etcdembed/pki.go":   {4, "certificate validity is checked by TLS peers against the machine's clock"},
	"leader/leader.go":   {3, "measures real time since etcd last answered against the lease TTL, which etcd counts on its real clock: a fake clock must never keep a deposed leader acting"},
	"leader/follower.go": {3, "ages the cached leader view against the election's real lease"},
	// A directory (ending in /) allows any count in its files.
	"cmd/fencectl/": {-1, "a client, not the coordinator: shows ages (a node's last contact) on the operator's machine"},
}

// allowance returns the entry of clockAllowed for path: its file's, or its directory's.
func allowance(path string) (key string, n int, why string, ok bool) {
	for k, a := range clockAllowed {
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
		calls, err := clockCalls(path)
		found[filepath.ToSlash(path)] = calls
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 30 {
		t.Fatalf("only %d files walked: is the test running in coordinator/?", len(found))
	}
	used := map[string]bool{}
	for path, calls := range found {
		key, n, why, ok := allowance(path)
		used[key] = ok
		switch {
		case len(calls) > 0 && !ok:
			t.Errorf("%s reads the machine's clock; use the injected clock:\n  %s", path, strings.Join(calls, "\n  "))
		case ok && n >= 0 && len(calls) != n:
			t.Errorf("%s reads the machine's clock %d times, %d allowed (%s); keep the allowance exact:\n  %s",
				path, len(calls), n, why, strings.Join(calls, "\n  "))
		}
	}
	for key := range clockAllowed {
		if !used[key] {
			t.Errorf("clockAllowed names %s, which holds no Go file", key)
		}
	}
}

// clockCalls lists the file's calls of clockReadings, resolving import names.
func clockCalls(path string) ([]string, error) {
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
	var calls []string
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
		for _, fn := range clockReadings[imports[pkg.Name]] {
			if sel.Sel.Name == fn {
				calls = append(calls, fmt.Sprintf("%s: %s.%s()", fset.Position(call.Pos()), pkg.Name, fn))
			}
		}
		return true
	})
	return calls, nil
}

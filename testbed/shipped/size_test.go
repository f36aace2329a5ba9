package shipped

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The size goals of issue #17: a file a reader can hold, a function a reader can follow.
const (
	maxFileLines = 600 // non-generated Go files, tests included
	maxFuncLines = 80  // functions and methods outside _test.go files, braces included
)

// oversized are the files and functions over the goals today, each with why it is still so. The
// list may only shrink: a new offender fails the test, and so does an entry that is no longer one
// (delete it). Keys are "path" for a file and "path:Func" or "path:Type.Method" for a function.
var oversized = map[string]string{
	// Empty: every file and function is within the goals (issue #17).
}

var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// offenders lists the non-generated Go files under root over maxFileLines and the functions over
// maxFuncLines, with their sizes.
func offenders(t *testing.T, root string) map[string]int {
	t.Helper()
	found := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "bin" || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil || generated.Match(src) {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if n := strings.Count(string(src), "\n"); n > maxFileLines {
			found[rel] = n
		}
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				found[rel+":"+funcName(fn)] = n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// funcName is Func, or Type.Method for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

func TestSizeGoals(t *testing.T) {
	found := offenders(t, "../..")
	var added, gone []string
	for k, n := range found {
		if _, ok := oversized[k]; !ok {
			added = append(added, fmt.Sprintf("%s (%d lines)", k, n))
		}
	}
	for k := range oversized {
		if _, ok := found[k]; !ok {
			gone = append(gone, k)
		}
	}
	slices.Sort(added)
	slices.Sort(gone)
	for _, k := range added {
		t.Errorf("over the size goal (files %d lines, functions %d outside tests): %s; split it", maxFileLines, maxFuncLines, k)
	}
	for _, k := range gone {
		t.Errorf("%s is within the size goals now: remove it from oversized", k)
	}
}

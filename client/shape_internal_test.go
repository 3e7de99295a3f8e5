package client

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the client and its commands, from its
// func line to its closing brace: one that is longer holds more than one
// step for a reader to follow.
const maxFuncLines = 75

// TestShape keeps every function of client/ (the package, its commands and
// helpers, tests aside) at most maxFuncLines long.
func TestShape(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files++
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			from, to := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
			if n := to - from + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long (at most %d)", path, from, fn.Name.Name, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("read %d files of client/: the walk missed the tree", files)
	}
}

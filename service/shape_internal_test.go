package service

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines bounds a function or method from its func line to its
// closing brace: a longer one holds more than one step to follow.
const maxFuncLines = 60

// maxFilesPerType bounds the files a type's methods are spread over: a
// type whose methods need more holds more than one role.
const maxFilesPerType = 3

// TestShape keeps the package's shape: short functions, and each type's
// methods in a few files (see the package doc in service.go).
func TestShape(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]map[string]bool{} // receiver type -> files
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			from, to := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
			if n := to - from + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long (at most %d)", name, from, funcName(fn), n, maxFuncLines)
			}
			if recv := recvType(fn); recv != "" {
				if files[recv] == nil {
					files[recv] = map[string]bool{}
				}
				files[recv][name] = true
			}
		}
	}
	recvs := make([]string, 0, len(files))
	for recv := range files {
		recvs = append(recvs, recv)
	}
	sort.Strings(recvs)
	for _, recv := range recvs {
		in := files[recv]
		if len(in) <= maxFilesPerType {
			continue
		}
		list := make([]string, 0, len(in))
		for name := range in {
			list = append(list, name)
		}
		sort.Strings(list)
		t.Errorf("type %s has methods in %d files (at most %d): %s", recv, len(list), maxFilesPerType, strings.Join(list, ", "))
	}
}

// recvType is the name of fn's receiver type, empty for a function.
func recvType(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	x := fn.Recv.List[0].Type
	for {
		switch e := x.(type) {
		case *ast.StarExpr:
			x = e.X
		case *ast.IndexExpr:
			x = e.X
		case *ast.IndexListExpr:
			x = e.X
		case *ast.ParenExpr:
			x = e.X
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}

// funcName names fn as (T).m or f.
func funcName(fn *ast.FuncDecl) string {
	if recv := recvType(fn); recv != "" {
		return "(" + recv + ")." + fn.Name.Name
	}
	return fn.Name.Name
}

// TestDecidersReadOnlyTheirSnapshot keeps the engine's deciders (every
// function named decide...) functions of their arguments: no method (so
// no view, store or configuration to reach), and no reading of the clock,
// whose reading the read step puts in the snapshot (see engine.go). The
// simulation runs them as they are for that reason.
func TestDecidersReadOnlyTheirSnapshot(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	deciders := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "decide") {
				continue
			}
			deciders++
			if fn.Recv != nil {
				t.Errorf("%s: %s is a method: a decider reads only its snapshot", name, funcName(fn))
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" && (sel.Sel.Name == "Now" || sel.Sel.Name == "Since" || sel.Sel.Name == "Until") {
						t.Errorf("%s: %s reads the clock (time.%s): the read step puts its reading in the snapshot", fset.Position(sel.Pos()), fn.Name.Name, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if deciders < 10 {
		t.Fatalf("%d deciders found: the test no longer sees them", deciders)
	}
}

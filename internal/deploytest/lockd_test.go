package deploytest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// lockdFlags returns lockd's flags by command ("" for the default command
// serve and the root, "check" for lockd check, ...), read from its kong
// structs: service/cmd/lockd is a main package and cannot be imported, so
// its struct declarations are parsed and rebuilt (same field names and
// tags, every value a string, bool or []string) and handed to kong itself,
// which names the flags exactly as it does for lockd.
func lockdFlags(t testing.TB) map[string]map[string]bool {
	t.Helper()
	k := lockdModel(t)
	out := map[string]map[string]bool{}
	var walk func(path string, n *kong.Node, inherited map[string]bool)
	walk = func(path string, n *kong.Node, inherited map[string]bool) {
		flags := map[string]bool{}
		for f := range inherited {
			flags[f] = true
		}
		for _, f := range n.Flags {
			flags[f.Name] = true
		}
		out[path] = flags
		for _, c := range n.Children {
			p := c.Name
			if c.DefaultCmd != nil || c.Tag != nil && c.Tag.Default == "withargs" {
				p = ""
			}
			if p == "" {
				// the default command's flags are also the root's
				for f := range flags {
					out[""][f] = true
				}
				walk("", c, flags)
				continue
			}
			walk(p, c, flags)
		}
	}
	walk("", k.Model.Node, nil)
	return out
}

// lockdEnv returns the environment variables lockd serve reads, each with
// the flag it sets.
func lockdEnv(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range lockdModel(t).Model.Node.Children {
		if c.Name != "serve" {
			continue
		}
		for _, f := range c.Flags {
			for _, e := range f.Envs {
				out[e] = f.Name
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("lockd serve reads no environment variable")
	}
	return out
}

// lockdModel returns kong's model of lockd's rebuilt flags.
func lockdModel(t testing.TB) *kong.Kong {
	t.Helper()
	dir := filepath.Join(deployDir(t), "..", "service", "cmd", "lockd")
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	structs := map[string]*ast.StructType{}
	for _, f := range matches {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st
				}
			}
			return true
		})
	}
	if structs["cli"] == nil {
		t.Fatal("service/cmd/lockd has no type cli")
	}
	b := &structBuilder{t: t, structs: structs, built: map[string]reflect.Type{}}
	root := reflect.New(b.build("cli"))
	k, err := kong.New(root.Interface(), kong.Name("lockd"), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatalf("kong on lockd's rebuilt flags: %v", err)
	}
	return k
}

type structBuilder struct {
	t       testing.TB
	structs map[string]*ast.StructType
	built   map[string]reflect.Type
}

func (b *structBuilder) build(name string) reflect.Type {
	if typ, ok := b.built[name]; ok {
		return typ
	}
	var fields []reflect.StructField
	for i, f := range b.structs[name].Fields.List {
		tag := ""
		if f.Tag != nil {
			s, err := strconv.Unquote(f.Tag.Value)
			if err != nil {
				b.t.Fatal(err)
			}
			tag = s
		}
		if len(f.Names) == 0 { // embedded: kong flattens it
			id, ok := f.Type.(*ast.Ident)
			if !ok || b.structs[id.Name] == nil {
				continue
			}
			if !strings.Contains(tag, `embed:`) {
				tag = strings.TrimSpace(tag + ` embed:""`)
			}
			fields = append(fields, reflect.StructField{Name: "Embedded" + strconv.Itoa(i), Type: b.build(id.Name), Tag: reflect.StructTag(tag)})
			continue
		}
		for _, n := range f.Names {
			if !n.IsExported() {
				continue
			}
			fields = append(fields, reflect.StructField{Name: n.Name, Type: b.fieldType(f.Type), Tag: reflect.StructTag(tag)})
		}
	}
	typ := reflect.StructOf(fields)
	b.built[name] = typ
	return typ
}

func (b *structBuilder) fieldType(e ast.Expr) reflect.Type {
	switch e := e.(type) {
	case *ast.Ident:
		if b.structs[e.Name] != nil {
			return b.build(e.Name)
		}
		if e.Name == "bool" {
			return reflect.TypeFor[bool]()
		}
	case *ast.ArrayType:
		return reflect.TypeFor[[]string]()
	case *ast.MapType:
		return reflect.TypeFor[map[string]string]()
	case *ast.StarExpr:
		return b.fieldType(e.X)
	}
	return reflect.TypeFor[string]()
}

// The rebuilt flags are lockd's: the ones deploy/ uses exist, with their
// store- twins, and an unknown one does not.
func TestLockdFlagsRebuilt(t *testing.T) {
	flags := lockdFlags(t)[""]
	for _, f := range []string{"server", "nkey", "store-nkey", "creds", "store-creds", "user", "store-user", "tlscert", "tlskey", "tlsca", "metrics", "prefix", "bucket", "max-in-flight", "allow-single-replica", "help"} {
		if !flags[f] {
			t.Errorf("lockd has no flag --%s (flags: %v)", f, flags)
		}
	}
	check := lockdFlags(t)["check"]
	for _, f := range []string{"server", "tlsca", "tlscert", "tlskey", "store-nkey", "store-inbox-prefix", "json", "fix"} {
		if !check[f] {
			t.Errorf("lockd check has no flag --%s (flags: %v)", f, check)
		}
	}
	if flags["no-such-flag"] {
		t.Error("made-up flag found")
	}
	// lockd's environment is its own: JETLOCK_*, with the seed files in
	// JETLOCK_NKEY and JETLOCK_STORE_NKEY; none of the nats CLI's.
	env := lockdEnv(t)
	for v, f := range map[string]string{"JETLOCK_SERVER": "server", "JETLOCK_NKEY": "nkey", "JETLOCK_STORE_NKEY": "store-nkey",
		"JETLOCK_CREDS": "creds", "JETLOCK_USER": "user", "JETLOCK_PASSWORD": "password", "JETLOCK_INBOX_PREFIX": "inbox-prefix",
		"JETLOCK_STORE_CREDS": "store-creds", "JETLOCK_STORE_USER": "store-user", "JETLOCK_STORE_PASSWORD": "store-password",
		"JETLOCK_STORE_INBOX_PREFIX": "store-inbox-prefix", "JETLOCK_TLSCERT": "tlscert", "JETLOCK_TLSKEY": "tlskey", "JETLOCK_TLSCA": "tlsca"} {
		if env[v] != f {
			t.Errorf("$%s sets --%s, want --%s", v, env[v], f)
		}
	}
	for v := range env {
		if !strings.HasPrefix(v, "JETLOCK_") {
			t.Errorf("lockd reads $%s", v)
		}
		if _, ok := identities[v]; ok {
			t.Errorf("lockd reads $%s, a public key of accounts.conf", v)
		}
	}
}

// Package js_test runs the JavaScript example (jetlock.mjs), which uses the
// TypeScript client (client/js), against the dev cluster and a service.
//
// It builds the client and installs the example in a copy of the two
// directories, so that it shares nothing with client/js's own test, which
// may run at the same time.
//
// The test needs node, npm and the npm registry (npm ci), so it runs only
// when JETLOCK_TEST_JS=1 asks for it: the README's test command must pass
// with Go and the module proxy alone. CI sets it.
package js_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// optIn is the environment variable that turns the test on.
const optIn = "JETLOCK_TEST_JS"

func TestJavaScriptExample(t *testing.T) {
	switch v := os.Getenv(optIn); v {
	case "":
		t.Skipf("%s is not set: the JavaScript example runs only when asked (%s=1; it needs node, npm and the npm registry)", optIn, optIn)
	case "1":
	default:
		t.Fatalf("%s=%q: want 1, or unset to skip", optIn, v)
	}
	// Asked for, the test fails rather than skips when a tool is missing.
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s=1 but %s is not on PATH: the JavaScript example needs node and npm", optIn, tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// examples/js depends on ../../client/js: copy both, keeping that layout.
	root := t.TempDir()
	example, lib := filepath.Join(root, "examples", "js"), filepath.Join(root, "client", "js")
	copyFiles(t, ".", example, "jetlock.mjs", "package.json", "package-lock.json")
	copyFiles(t, filepath.Join("..", "..", "client", "js"), lib, "package.json", "package-lock.json", "tsconfig.json")
	libSrc := filepath.Join("..", "..", "client", "js", "src")
	if err := filepath.WalkDir(libSrc, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".ts" {
			return err
		}
		rel, err := filepath.Rel(libSrc, filepath.Dir(p))
		if err != nil {
			return err
		}
		copyFiles(t, filepath.Dir(p), filepath.Join(lib, "src", rel), filepath.Base(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The client's npm ci builds dist/ (its prepare script), as a user's does.
	for _, step := range []struct {
		dir  string
		args []string
	}{
		{lib, []string{"ci", "--no-audit", "--no-fund"}},
		{example, []string{"ci", "--no-audit", "--no-fund"}},
	} {
		npm := exec.CommandContext(ctx, "npm", step.args...)
		npm.Dir = step.dir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm %v in %s (npm ci needs the npm registry; without %s the test skips): %v\n%s", step.args, step.dir, optIn, err, out)
		}
	}

	env := testenv.Start(t)
	env.Serve(testenv.Config())
	nctx, ncancel := context.WithTimeout(ctx, time.Minute)
	defer ncancel()
	node := exec.CommandContext(nctx, "node", "jetlock.mjs", env.Cluster.URLs(), "orders/js-1")
	node.Dir = example
	out, err := node.CombinedOutput()
	text := string(out)
	t.Logf("node jetlock.mjs:\n%s", text)
	if err != nil {
		t.Fatalf("node: %v", err)
	}

	num := func(re string) uint64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("output has no line matching %q", re)
		}
		n, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t1 := num(`(?m)^acquired orders/js-1: token (\d+), ttl 3000 ms$`)
	t2 := num(`(?m)^acquired orders/js-1 again: token (\d+)$`)
	if t1 == 0 || t2 <= t1 {
		t.Fatalf("tokens %d then %d: want rising", t1, t2)
	}
	if got := num(`second acquire: locked by js-example \(token (\d+)\)`); got != t1 {
		t.Errorf("the locked error named token %d, want %d", got, t1)
	}
	if got := num(`(?m)^renewed orders/js-1 by itself: token (\d+), ttl 3000 ms$`); got != t1 {
		t.Errorf("renewal changed the token to %d", got)
	}
	s1, s2 := strconv.FormatUint(t1, 10), strconv.FormatUint(t2, 10)
	for _, want := range []string{
		`write "written by the first holder" with token ` + s1 + `: accepted`,
		`released orders/js-1: true`,
		`write "written by the second holder" with token ` + s2 + `: accepted`,
		`write "late write by the first holder" with token ` + s1 + `: REFUSED (stale: token ` + s2 + ` was accepted)`,
		`store holds "written by the second holder"`,
		`first lease's signal: released`,
		`status: held true by js-example-2, token ` + s2,
		"done",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(text, "lease_id") {
		t.Error("the example printed a lease id")
	}
}

// copyFiles copies the named files of dir from into dir to.
func copyFiles(t *testing.T, from, to string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(from, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

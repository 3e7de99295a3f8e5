// Package js_test runs the tests of the TypeScript client (@jetlock/client,
// in this directory) from `go test ./...`: npm ci and npm test, against
// lockd --dev clusters the Node tests start, and against the package as
// npm pack makes it. Any failure fails the Go test.
//
// The test needs node, npm and the npm registry (npm ci), so it runs only
// when JETLOCK_TEST_JS=1 asks for it, as examples/js does: the README's
// test command must pass with Go and the module proxy alone. CI sets it.
package js_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// optIn is the environment variable that turns the test on.
const optIn = "JETLOCK_TEST_JS"

func TestTypeScriptClient(t *testing.T) {
	switch v := os.Getenv(optIn); v {
	case "":
		t.Skipf("%s is not set: the TypeScript client's tests run only when asked (%s=1; they need node, npm and the npm registry)", optIn, optIn)
	case "1":
	default:
		t.Fatalf("%s=%q: want 1, or unset to skip", optIn, v)
	}
	for _, tool := range []string{"node", "npm", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s=1 but %s is not on PATH: the TypeScript client's tests need node, npm and go", optIn, tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	run := func(what string, env []string, name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = "."
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		t.Logf("%s:\n%s", what, out)
	}
	// Exactly what a user runs: npm ci (its prepare script builds dist/), then
	// npm test (which compiles the tests and runs them, with --expose-gc for
	// the heap test, and packs and installs the package in a fresh project).
	run("npm ci (it needs the npm registry; without "+optIn+" the test skips)", nil, "npm", "ci", "--no-audit", "--no-fund")

	// The binaries the Node tests start, built once here rather than in
	// every test file.
	bin := t.TempDir()
	lockd, helper := filepath.Join(bin, "lockd"), filepath.Join(bin, "gohelper")
	run("go build lockd", nil, "go", "build", "-o", lockd, "../../service/cmd/lockd")
	run("go build gohelper", nil, "go", "build", "-o", helper, "./testdata/gohelper")
	run("npm test", []string{"JETLOCK_LOCKD=" + lockd, "JETLOCK_GOHELPER=" + helper}, "npm", "test")
}

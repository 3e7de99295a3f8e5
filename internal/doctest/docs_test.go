//go:build unix

package doctest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/doctest"
)

// docGlobs are the documents whose shell blocks are tested, relative to
// the repository's root.
var docGlobs = []string{"README.md", "docs/*.md", "deploy/README.md"}

// aliases are replaced in a block before it runs: the documents say
// "go run ./…" from the repository's root, the test runs the binaries it
// built, in a directory of the block's own.
var aliases = []struct{ from, to string }{
	{"go run ./service/cmd/lockd", "lockd"},
	{"go run ./client/cmd/jetlock", "jetlock"},
	{"go run ./bench", "bench"},
}

// blockTimeout bounds a block (setup included) that sets no timeout: a
// safety net against a block that hangs, generous for a busy machine.
const blockTimeout = 2 * time.Minute

// TestDocsSyntax parses every shell block of the documents and checks it
// with bash -n, the blocks marked skip included. It needs no cluster.
func TestDocsSyntax(t *testing.T) {
	bash := lookBash(t)
	for _, b := range docBlocks(t) {
		t.Run(b.Where(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bash, "-n")
			cmd.Stdin = strings.NewReader(b.Script())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: bash -n: %v\n%s\n--- the block:\n%s", b.Where(), err, out, b.Script())
			}
		})
	}
}

// TestDocs runs every shell block of the documents that is not marked
// skip, each against a fresh lockd --dev, and checks its exit status and
// expected output (see package doctest).
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the documentation test builds lockd, jetlock and the nats CLI and runs the examples")
	}
	bash := lookBash(t)
	blocks := docBlocks(t)
	start := time.Now()
	tl := buildTools(t)
	t.Logf("tools ready in %v: %s", time.Since(start).Round(time.Millisecond), tl.bin)

	t.Run("flags", func(t *testing.T) { checkFlags(t, tl, blocks) })
	ran, skipped := 0, map[string][]string{}
	for _, b := range blocks {
		if b.Skip != "" {
			skipped[b.Skip] = append(skipped[b.Skip], b.Where())
			continue
		}
		ran++
		t.Run(b.Where(), func(t *testing.T) {
			runBlock(t, bash, tl, b)
		})
	}
	reasons := make([]string, 0, len(skipped))
	for r := range skipped {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d blocks: %d run, %d marked skip", len(blocks), ran, len(blocks)-ran)
	for _, r := range reasons {
		fmt.Fprintf(&sb, "\n  skip %s: %s", r, strings.Join(skipped[r], ", "))
	}
	t.Logf("%s\ntotal %v", sb.String(), time.Since(start).Round(time.Millisecond))
}

// runBlock runs b's setup and steps against a fresh lockd --dev.
func runBlock(t *testing.T, bash string, tl *tools, b doctest.Block) {
	timeout := b.Timeout
	if timeout == 0 {
		timeout = blockTimeout
	}
	ld := startLockd(t, tl)
	dir := t.TempDir()
	env := append(tl.env(ld.urls), b.Env...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	for _, f := range b.Files {
		if err := copyTree(filepath.Join(repoRoot(t), filepath.FromSlash(f)), filepath.Join(dir, filepath.FromSlash(f))); err != nil {
			t.Fatalf("%s: files %s: %v", b.Where(), f, err)
		}
	}
	for _, s := range b.Setup {
		out, code, err := runShell(ctx, bash, dir, env, alias(s))
		if err != nil || code != 0 {
			t.Fatalf("%s: setup %q: status %d %v\n%s\n--- lockd:\n%s", b.Where(), s, code, err, out, ld.output())
		}
	}
	vars := doctest.Vars{}
	for i, s := range b.Steps {
		code := alias(doctest.Substitute(s.Code, vars))
		out, status, err := runShell(ctx, bash, dir, env, code)
		t.Logf("%s:%d:\n%s--- output (status %d):\n%s", b.File, s.Line, code, status, out)
		if err != nil {
			t.Fatalf("%s:%d: %v (block timeout %v)\n--- lockd:\n%s", b.File, s.Line, err, timeout, ld.output())
		}
		if cerr := doctest.Check(out, s.Expect, vars); cerr != nil {
			t.Errorf("%s:%d: %v", b.File, s.Line, cerr)
		}
		last := i == len(b.Steps)-1
		switch {
		case status != 0 && !last:
			t.Fatalf("%s:%d: status %d; the block's later commands did not run (expect-exit applies to the block's last command)", b.File, s.Line, status)
		case last && status != b.ExpectExit:
			t.Errorf("%s:%d: the block ended with status %d, want %d", b.File, s.Line, status, b.ExpectExit)
		}
	}
	if t.Failed() {
		t.Logf("--- lockd:\n%s", ld.output())
	}
}

// runShell runs script with bash -euo pipefail in dir and returns its
// output (stdout and stderr interleaved) and exit status. err is set only
// when the script could not run or ran out of time. Whatever the script
// left running in the background is killed with it.
func runShell(ctx context.Context, bash, dir string, env []string, script string) (string, int, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bash, "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = &out, &out // one pipe: the order of writes is kept
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil {
		return out.String(), -1, fmt.Errorf("timed out: %w", ctx.Err())
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), exit.ExitCode(), nil
	}
	if err != nil {
		return out.String(), -1, err
	}
	return out.String(), 0, nil
}

// alias replaces the aliases in a script.
func alias(script string) string {
	for _, a := range aliases {
		script = strings.ReplaceAll(script, a.from, a.to)
	}
	return script
}

// docBlocks reads the documents at test time and returns their blocks.
func docBlocks(t *testing.T) []doctest.Block {
	t.Helper()
	root := repoRoot(t)
	var blocks []doctest.Block
	for _, g := range docGlobs {
		files, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no document matches %s", g)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			bs, err := doctest.Parse(filepath.ToSlash(rel), src)
			if err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, bs...)
		}
	}
	return blocks
}

// repoRoot returns the directory of the module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func lookBash(t *testing.T) string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("the documentation's examples are bash: %v", err)
	}
	return bash
}

// copyTree copies the file or directory src to dst, keeping each file's
// mode (the scripts stay executable) and leaving out what git ignores
// (make-ca.sh's and make-nkeys.sh's output of an earlier run, say).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if ignored(path) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
}

// ignored reports whether git ignores path (false when git cannot say).
func ignored(path string) bool {
	cmd := exec.Command("git", "check-ignore", "-q", path)
	cmd.Dir = filepath.Dir(path)
	return cmd.Run() == nil
}

//go:build unix

package doctest_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// natsCLI is the nats CLI the test installs when none is on PATH: the
// version the documents name.
const natsCLI = "github.com/nats-io/natscli/nats@v0.5.0"

// tools are the commands the blocks run, built for the test.
type tools struct {
	bin    string // lockd, jetlock, bench, nk and, unless on PATH, nats
	config string // XDG_CONFIG_HOME of the blocks: no nats contexts
	goenv  string // the go command's settings file, kept
}

// buildTools builds lockd, jetlock and bench from the repository, nk (for
// deploy/make-nkeys.sh), and the nats CLI unless one is on PATH.
func buildTools(t *testing.T) *tools {
	t.Helper()
	root := repoRoot(t)
	tl := &tools{bin: t.TempDir(), config: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, c := range []struct{ name, pkg string }{
		{"lockd", "./service/cmd/lockd"},
		{"jetlock", "./client/cmd/jetlock"},
		{"bench", "./bench"}, // for its flags only
		// deploy/make-nkeys.sh runs nk; it is a package of the nkeys
		// module that go.mod already requires, so it builds offline.
		{"nk", "github.com/nats-io/nkeys/nk"},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(tl.bin, c.name), c.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOENV", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	goenv, modcache, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	tl.goenv = goenv
	if p, err := exec.LookPath("nats"); err == nil {
		t.Logf("nats CLI: %s (on PATH)", p)
		return tl
	}
	// Outside the module, so that go.mod is left alone. Offline, the
	// module proxy cannot answer (go install asks it about deprecation
	// even for a module in the cache), so the module cache serves as one.
	var failed []string
	for _, proxy := range []string{"", "GOPROXY=file://" + filepath.ToSlash(filepath.Join(modcache, "cache", "download"))} {
		cmd := exec.CommandContext(ctx, "go", "install", natsCLI)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOBIN="+tl.bin)
		if proxy != "" {
			cmd.Env = append(cmd.Env, proxy)
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Logf("nats CLI: %s installed (%s)", natsCLI, cmp.Or(proxy, "the module proxy"))
			return tl
		}
		failed = append(failed, fmt.Sprintf("%s go install %s: %v\n%s", proxy, natsCLI, err, out))
	}
	t.Fatalf("no nats CLI on PATH, and it cannot be installed:\n%s", strings.Join(failed, "\n"))
	return nil
}

// env returns the environment of a block: the test's, without NATS and
// jetlock settings, with the tools first on PATH and NATS_URL naming the
// dev cluster.
func (tl *tools) env(urls string) []string {
	env := []string{
		"PATH=" + tl.bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"NATS_URL=" + urls,
		"XDG_CONFIG_HOME=" + tl.config,
		"GOENV=" + tl.goenv,
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "JETLOCK_") ||
			k == "PATH" || k == "XDG_CONFIG_HOME" || k == "GOENV" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// lockd is a running lockd --dev.
type lockd struct {
	urls string
	out  *syncBuffer
}

func (l *lockd) output() string { return l.out.String() }

// startLockd starts lockd --dev with its data in a fresh directory, on
// free loopback ports, and waits until /readyz answers 200. It is stopped
// (interrupted, then killed) by t.Cleanup.
func startLockd(t *testing.T, tl *tools) *lockd {
	t.Helper()
	var err error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before lockd listens
		var l *lockd
		if l, err = tryLockd(t, tl); err == nil {
			return l
		}
		t.Logf("lockd --dev did not start: %v", err)
	}
	t.Fatalf("lockd --dev did not start: %v", err)
	return nil
}

func tryLockd(t *testing.T, tl *tools) (*lockd, error) {
	ports := make([]string, 4)
	for i := range ports {
		p, err := devcluster.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = strconv.Itoa(p)
	}
	metrics := "127.0.0.1:" + ports[3]
	cmd := exec.Command(filepath.Join(tl.bin, "lockd"), "--dev", "--dev-dir", t.TempDir(),
		"--dev-ports", strings.Join(ports[:3], ","), "--metrics", metrics)
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "NATS_") && !strings.HasPrefix(k, "JETLOCK_") {
			env = append(env, kv)
		}
	}
	l := &lockd{out: &syncBuffer{}}
	cmd.Env, cmd.Stdout, cmd.Stderr = env, l.out, l.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get("http://" + metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("lockd exited (%v):\n%s", cmd.ProcessState, l.output())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("not ready within 60 s:\n%s", l.output())
		}
	}
	t.Cleanup(stop)
	urls := make([]string, 3)
	for i, p := range ports[:3] {
		urls[i] = "nats://127.0.0.1:" + p
	}
	l.urls = strings.Join(urls, ",")
	return l, nil
}

// syncBuffer is what a process writes while the test reads it.
type syncBuffer = testenv.SyncBuffer

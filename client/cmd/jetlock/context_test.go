package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// --context reads a nats CLI context (under $XDG_CONFIG_HOME/nats), and
// flags given override its settings.
func TestNATSContext(t *testing.T) {
	t.Parallel()
	cfg := t.TempDir()
	user, pw := cluster.User(devcluster.Operator)
	ctxDir := filepath.Join(cfg, "nats", "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"url": urls, "user": user, "password": pw})
	if err := os.WriteFile(filepath.Join(ctxDir, "ops.json"), body, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"XDG_CONFIG_HOME=" + cfg, "HOME=" + cfg}
	run := func(args ...string) result {
		t.Helper()
		// No --server: the context's URL.
		cmd := start(t, env, args...)
		return cmd.wait(t, 30*time.Second)
	}
	r := run("--context", "ops", "revoke", "ctx:1", "--reason", "context test")
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, "not held") {
		t.Fatalf("revoke through the context: %q", r.stdout)
	}
	// Flags override the context: another user, refused at connect.
	r = run("--context", "ops", "--user", "caller", "--password", "wrong", "status", "ctx:1")
	wantCode(t, r, 77)
	if !strings.HasPrefix(r.stderr, "jetlock: permission_denied: connect to ") {
		t.Fatalf("overridden user: %q", r.stderr)
	}
	r = run("--context", "no-such-context", "status", "ctx:1")
	wantCode(t, r, 2)
}

// Interrupting a waiting run abandons its place in the queue and starts
// nothing; the interrupt is the exit (128+SIGINT).
func TestRunInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	finish := filepath.Join(dir, "finish")
	holder := start(t, nil, "run", "--ttl", "5s", "run:interrupt", "--", "sh", "-c",
		`i=0; while [ ! -e `+finish+` ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done`)
	c := newClient(t)
	deadline := time.Now().Add(20 * time.Second)
	for !status(t, c, "run:interrupt").Held {
		if time.Now().After(deadline) {
			t.Fatal("never held")
		}
		time.Sleep(20 * time.Millisecond)
	}
	marker := filepath.Join(dir, "ran")
	w := start(t, nil, "run", "--wait", "30s", "run:interrupt", "--", "touch", marker)
	for status(t, c, "run:interrupt").Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("never queued")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = w.cmd.Process.Signal(os.Interrupt)
	r := w.wait(t, 20*time.Second)
	wantCode(t, r, 130)
	if !strings.Contains(r.stderr, "interrupted") {
		t.Fatalf("stderr %q", r.stderr)
	}
	for status(t, c, "run:interrupt").Waiters != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the interrupted run stayed queued")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, holder.wait(t, 20*time.Second), 0)
	if exists(marker) {
		t.Fatal("the interrupted run started its command")
	}
}

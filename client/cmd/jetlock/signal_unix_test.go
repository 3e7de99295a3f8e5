//go:build unix

package main_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGINT or SIGTERM to a waiting 'jetlock acquire --wait' cancels its
// request at the service before it exits (128+N): when the holder
// releases, the lock is free for the next caller at once, not handed to
// the vanished waiter (which refused everyone else until its wait record
// lapsed, about 7 s).
func TestAcquireInterruptedWhileWaitingCancels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGINT, "SIGINT"}, {syscall.SIGTERM, "SIGTERM"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := "acquire:interrupt:" + strings.ToLower(tc.name)
			holder, w := holdAndQueue(t, res)
			if err := w.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			r := w.wait(t, 20*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// At once: one attempt, no waiting.
			l, err := newClient(t).TryAcquire(ctx, res)
			if err != nil {
				t.Errorf("after the holder released, another caller got %v: the interrupted waiter was still queued", err)
			} else {
				_ = l.Release(ctx)
			}
			wantError(t, r, 128+int(tc.sig))
			if want := "jetlock: interrupted: " + tc.name + " while acquiring " + res; !strings.HasPrefix(r.stderr, want) || r.stdout != "" {
				t.Fatalf("stderr %q stdout %q, want %q...", r.stderr, r.stdout, want)
			}
		})
	}
}

// With --json, the interruption is a JSON error too.
func TestAcquireInterruptedJSON(t *testing.T) {
	t.Parallel()
	_, w := holdAndQueue(t, "acquire:interrupt:json", "--json")
	_ = w.cmd.Process.Signal(os.Interrupt)
	r := w.wait(t, 20*time.Second)
	if r.code != 130 || r.stderr != "" {
		t.Fatalf("exit %d stderr %q, want 130 and nothing on stderr", r.code, r.stderr)
	}
	if e := decode[errorLine](t, r.stdout); e.Error.Code != "interrupted" || e.Error.ExitCode != 130 {
		t.Fatalf("%s", r.stdout)
	}
}

//go:build unix

package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// The tests of jetlock run's side of the client's promises (issue 39).

// A lost lease stops the command with ONE SIGTERM, then SIGKILL after
// --grace. The guard used to signal the group and then each of its
// children, the command included: two SIGTERMs, a millisecond apart.
func TestRunSignalsItsCommandOnce(t *testing.T) {
	t.Parallel()
	const resource = "run:once"
	pidFile := filepath.Join(t.TempDir(), "pid")
	env, argv := helperCmd("countterm", pidFile)
	p := start(t, env, append([]string{"run", "--ttl", "3s", "--grace", "700ms", resource, "--"}, argv...)...)
	pid := pidOf(t, pidFile)
	wantCode(t, jl(t, operator("revoke", resource, "--reason", "count the signals")...), 0)
	wantCode(t, p.wait(t, 20*time.Second), 79)
	if !groupGone(pid) {
		t.Fatal("the command outlived jetlock")
	}
	b, err := os.ReadFile(pidFile + ".term")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "TERM"); n != 1 {
		t.Fatalf("the command got %d SIGTERMs, want one (then SIGKILL)", n)
	}
}

// A command that reads from the terminal is stopped by SIGTTIN (its
// process group is not the terminal's foreground group) and would hold the
// lock, frozen, until the hold cap. jetlock notices, stops it, releases
// the lock and exits 128+N (as a shell reports a stopped job), with one
// line saying what happened. The test freezes the command with the same
// signal the terminal sends.
func TestRunStopsAFrozenCommand(t *testing.T) {
	t.Parallel()
	const resource = "run:frozen"
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	p := start(t, nil, "run", "--ttl", "5s", "--grace", "1s", resource, "--", "sh", "-c",
		`echo $$ > `+pidFile+`; kill -TTIN $$; sleep 30`)
	pid := pidOf(t, pidFile)
	r := p.wait(t, 30*time.Second)
	wantError(t, r, 128+int(syscall.SIGTTIN))
	if !strings.Contains(r.stderr, "SIGTTIN") || !strings.Contains(r.stderr, "terminal") {
		t.Fatalf("stderr %q does not say the command was frozen reading the terminal", r.stderr)
	}
	if !groupGone(pid) {
		t.Fatal("the frozen command outlived jetlock")
	}
	if st := status(t, newClient(t), resource); st.Held {
		t.Fatalf("still held after the frozen command was stopped: %+v", st)
	}
}

// A short outage that ends before the client's deadline does not cost the
// command its lease: when a renewal gets through after jetlock reconnects,
// a stop that has begun (SIGTERM at the deadline less --grace) is called
// off before SIGKILL, and jetlock exits with the command's own code. It
// used to kill the command and exit 79 though the lease never ended.
func TestRunRenewalAfterAnOutageCallsTheStopOff(t *testing.T) {
	t.Parallel()
	const (
		resource = "run:outage"
		ttl      = 12 * time.Second
		grace    = 4 * time.Second // SIGTERM 7s after the last renewal was sent
	)
	dir := t.TempDir()
	pidFile, finish := filepath.Join(dir, "pid"), filepath.Join(dir, "finish")
	proxy := behindProxy(t)
	p := startVia(t, proxy.URL(), "run", "--ttl", ttl.String(), "--grace", grace.String(), resource, "--", "sh", "-c",
		`trap '' TERM; echo $$ > `+pidFile+`; i=0; while [ ! -e `+finish+` ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done`)
	pid := pidOf(t, pidFile)
	c := newClient(t)
	token := status(t, c, resource).Token
	renewalSeen(t, resource)
	proxy.Cut()
	waitStderr(t, p, "stopping the command", 20*time.Second)
	proxy.Heal()
	waitStderr(t, p, "called off", 20*time.Second)
	if groupGone(pid) {
		t.Fatal("the command was killed though a renewal got through")
	}
	if st := status(t, c, resource); !st.Held || st.Token != token {
		t.Fatalf("status after the outage %+v, want the same lease (token %d)", st, token)
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t, 30*time.Second)
	if r.code != 0 {
		t.Fatalf("exit %d, want the command's 0; stderr %q", r.code, r.stderr)
	}
}

// waitOutput waits up to d until what p printed on stdout satisfies ok.
func waitOutput(t *testing.T, p *proc, ok func(stdout string) bool, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, d, func() bool { return ok(p.stdout.String()) }, "jetlock %v printed %q", p.cmd.Args[1:], p.stdout.String())
}

// waitStderr waits up to d until p has printed text on stderr.
func waitStderr(t *testing.T, p *proc, text string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.stderr.String(), text) {
		select {
		case <-p.done:
			t.Fatalf("jetlock exited (%d) before it said %q; stderr %q", p.res.code, text, p.res.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("jetlock did not say %q in %v; stderr %q", text, d, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --timeout 4s acquire --wait 500ms takes --wait plus two --timeout at
// most, its cleanup included, with the network gone after the request
// went out. The cancel of the abandoned request used to run on a fresh
// --timeout after the whole budget: 12.5s here.
func TestAcquireWithinItsBudgetWhenTheNetworkGoes(t *testing.T) {
	t.Parallel()
	resource := fmt.Sprintf("acquire:budget:%d", time.Now().UnixNano()) // its holder outlives the test
	holder := jl(t, "acquire", "--ttl", "30s", resource)
	wantCode(t, holder, 0)
	proxy := behindProxy(t)
	p := startVia(t, proxy.URL(), "--timeout", "4s", "acquire", "--wait", "500ms", resource)
	c := newClient(t)
	deadline := time.Now().Add(20 * time.Second)
	for status(t, c, resource).Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("never queued")
		}
		time.Sleep(20 * time.Millisecond)
	}
	proxy.Cut()
	r := p.wait(t, 30*time.Second)
	wantError(t, r, 69)
	// The budget is 500ms + 2 × 4s from jetlock's start; 2s more covers
	// the process's start and connect. The old code took 4s more.
	if budget := 8500*time.Millisecond + 2*time.Second; r.took > budget {
		t.Fatalf("took %v, want at most --wait + 2 × --timeout (%v with jetlock's start)", r.took, budget)
	}
}

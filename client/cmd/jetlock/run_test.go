//go:build unix

package main_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/tcpproxy"
)

// The command's exit code comes through, a signal's death is 128+N, the
// command sees the lease in its environment, and the lease is released
// when it exits.
func TestRunPassesExitCodeAndEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := filepath.Join(dir, "env")
	r := jl(t, "run", "--ttl", "5s", "--owner", "passthrough", "run:exit", "--", "sh", "-c",
		`echo "$JETLOCK_RESOURCE $JETLOCK_TOKEN ${#JETLOCK_LEASE_ID}" > `+env+`; exit 7`)
	wantPassthrough(t, r, 7)
	b, err := os.ReadFile(env)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != "run:exit" {
		t.Fatalf("command's environment: %q", b)
	}
	if tok, err := strconv.ParseUint(f[1], 10, 64); err != nil || tok == 0 {
		t.Fatalf("JETLOCK_TOKEN %q", f[1])
	}
	if f[2] == "0" {
		t.Fatal("JETLOCK_LEASE_ID empty")
	}
	if st := status(t, newClient(t), "run:exit"); st.Held {
		t.Fatalf("still held after the command exited: %+v", st)
	}
	wantCode(t, jl(t, "run", "run:exit", "--", "true"), 0)
	// Everything after the resource is the command's, flags included.
	argv := filepath.Join(dir, "argv")
	wantCode(t, jl(t, "run", "run:exit", "--", "sh", "-c", `echo "$@" > `+argv, "sh", "--ttl", "-x", "--"), 0)
	if b, _ := os.ReadFile(argv); string(b) != "--ttl -x --\n" {
		t.Fatalf("the command got arguments %q", b)
	}
	wantPassthrough(t, jl(t, "run", "run:exit", "--", "sh", "-c", "kill -KILL $$"), 128+9)
	r = jl(t, "run", "run:exit", "--", "no-such-command-jetlock")
	wantCode(t, r, 127)
}

// A second run without --wait exits 75 with the holder in its one-line
// error and does not start its command; ls shows the holder and a waiter;
// the waiter runs once the holder is done.
func TestRunLockedAndLs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started, finish := filepath.Join(dir, "started"), filepath.Join(dir, "finish")
	holder := start(t, nil, "run", "--ttl", "5s", "--owner", "backup", "run:locked", "--", "sh", "-c",
		`touch `+started+`; i=0; while [ ! -e `+finish+` ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done`)
	waitFile(t, started, 20*time.Second)
	token := status(t, newClient(t), "run:locked").Token

	marker := filepath.Join(dir, "second-ran")
	r := jl(t, "run", "run:locked", "--", "touch", marker)
	wantCode(t, r, 75)
	want := "jetlock: locked: resource is held by another lease (owner backup, token " + strconv.FormatUint(token, 10) + ")\n"
	if r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	r = jl(t, "run", "--wait", "300ms", "run:locked", "--", "touch", marker)
	wantCode(t, r, 75)
	if exists(marker) {
		t.Fatal("a run refused the lock still started its command")
	}

	waiterRan := filepath.Join(dir, "waiter-ran")
	waiter := start(t, nil, "run", "--wait", "30s", "--owner", "restore", "run:locked", "--", "sh", "-c", `echo $JETLOCK_TOKEN > `+waiterRan)
	deadline := time.Now().Add(10 * time.Second)
	for status(t, newClient(t), "run:locked").Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ls := jl(t, "ls", "run:lock")
	wantCode(t, ls, 0)
	lines := strings.Split(strings.TrimSpace(ls.stdout), "\n")
	if len(lines) != 2 || !regexp.MustCompile(`^RESOURCE\s+OWNER\s+TOKEN\s+EXPIRES IN\s+WAITERS\s+SESSION$`).MatchString(lines[0]) {
		t.Fatalf("ls output:\n%s", ls.stdout)
	}
	if !regexp.MustCompile(`^run:locked\s+backup\s+` + strconv.FormatUint(token, 10) + `\s+\d[\d.]*(ms|s)\s+1\s+-$`).MatchString(lines[1]) {
		t.Fatalf("ls row %q does not show the holder and one waiter", lines[1])
	}
	if exists(waiterRan) {
		t.Fatal("the waiter ran while the lock was held")
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, holder.wait(t, 20*time.Second), 0)
	wantCode(t, waiter.wait(t, 20*time.Second), 0)
	b, _ := os.ReadFile(waiterRan)
	if got, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); got <= token {
		t.Fatalf("the waiter ran with token %q, want one above %d", b, token)
	}
}

// pidOf reads a pid a command wrote.
func pidOf(t *testing.T, path string) int {
	t.Helper()
	waitFile(t, path, 20*time.Second)
	var pid int
	for range 100 {
		b, _ := os.ReadFile(path)
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			pid = n
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatalf("no pid in %s", path)
	}
	return pid
}

func groupGone(pgid int) bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) }

// A revoke stops the command: SIGTERM at once, SIGKILL after --grace for
// one that ignores SIGTERM, within grace + 1s of the loss; exit 79.
func TestRunRevokeStopsCommand(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		script  string
		minTook time.Duration
	}{
		{"sigterm", `echo $$ > %s; sleep 60`, 0},
		{"ignores-sigterm", `trap '' TERM; echo $$ > %s; i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done`, 700 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			resource := "run:revoke:" + c.name
			pidFile := filepath.Join(t.TempDir(), "pid")
			const grace = 700 * time.Millisecond // the most a 3s TTL allows is 750ms
			p := start(t, nil, "run", "--ttl", "3s", "--grace", grace.String(), resource, "--",
				"sh", "-c", strings.ReplaceAll(c.script, "%s", pidFile))
			pid := pidOf(t, pidFile)

			// Without operator rights: a clear refusal, the lease stays.
			r := jl(t, "revoke", resource, "--reason", "test")
			wantCode(t, r, 77)
			if !strings.Contains(r.stderr, "permission") || r.took > 5*time.Second {
				t.Fatalf("revoke as a caller: %q after %v", r.stderr, r.took)
			}
			r = jl(t, operator("revoke", resource, "--reason", "test revoke")...)
			wantCode(t, r, 0)
			revoked := time.Now()
			if !strings.HasPrefix(r.stdout, "revoked "+resource+": ended the lease with token ") {
				t.Fatalf("revoke said %q", r.stdout)
			}
			res := p.wait(t, 20*time.Second)
			wantCode(t, res, 79)
			took := time.Since(revoked)
			// The loss is noticed at the next renewal (a third of the 3s
			// TTL); 2s more for a busy machine.
			if took > grace+time.Second+2*time.Second || took < c.minTook {
				t.Fatalf("jetlock exited %v after the revoke, want within [%v, grace %v + 1s + a renewal interval]", took, c.minTook, grace)
			}
			if !strings.Contains(res.stderr, "lease_lost") {
				t.Fatalf("stderr %q", res.stderr)
			}
			if !groupGone(pid) {
				out, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,stat,comm").Output()
				t.Fatalf("the command's process group %d outlived jetlock:\n%s", pid, out)
			}
		})
	}
}

// A command paused (with jetlock, as in a frozen VM) past its lease's TTL
// is taken over; when it resumes, its write with the old token is refused
// by the fenced store, and jetlock stops it with exit 79.
func TestRunPausedCommandIsFenced(t *testing.T) {
	t.Parallel()
	const resource = "run:paused"
	c, b := pausedHolderIsFenced(t, resource,
		[]string{"run", "--ttl", "3s", "--owner", "paused", resource}, // a TTL a busy machine still renews
		[]string{"run", "--wait", "20s", "--ttl", "5s", "--grace", "1s", resource})
	_ = b.cmd.Process.Signal(syscall.SIGTERM) // forwarded: ends B's helper
	if r := b.wait(t, 20*time.Second); r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("B exited %d after SIGTERM was forwarded, want %d; stderr %q", r.code, 128+int(syscall.SIGTERM), r.stderr)
	}
	if st := status(t, c, resource); st.Held {
		t.Fatalf("held after both runs ended: %+v", st)
	}
}

// pausedHolderIsFenced runs jetlock with aArgs (a lock's holder, or an
// election's leader, of resource) over a command that writes "stale" to a
// fenced store when told, freezes jetlock, its guard and its command past
// the lease's TTL, and runs jetlock with bArgs over one that writes
// "fresh" at once. B's write must be accepted with a larger token; the
// paused command, resumed, must see its write refused as stale; the old
// jetlock, resumed, must stop it and exit 79. It returns a client and B,
// still running.
func pausedHolderIsFenced(t *testing.T, resource string, aArgs, bArgs []string) (*client.Client, *proc) {
	t.Helper()
	store := newFencedStore(t)
	dir := t.TempDir()
	goA, resA := filepath.Join(dir, "goA"), filepath.Join(dir, "resA")
	env, argv := helperCmd("fencedwrite", store.srv.URL, "stale", goA, resA)
	a := start(t, env, append(append(aArgs, "--"), argv...)...)
	c := newClient(t)
	deadline := time.Now().Add(20 * time.Second)
	for !status(t, c, resource).Held {
		if time.Now().After(deadline) {
			t.Fatal("never acquired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t1 := status(t, c, resource).Token
	guard := childOf(t, a.cmd.Process.Pid)
	child := childOf(t, guard) // the command has started
	// Freeze jetlock, its guard and its command, as a frozen VM would.
	for _, pid := range []int{a.cmd.Process.Pid, guard} {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	}
	if err := syscall.Kill(-child, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-child, syscall.SIGCONT) })

	// Another jetlock takes over once the lease expired, and writes.
	goB, resB := filepath.Join(dir, "goB"), filepath.Join(dir, "resB")
	if err := os.WriteFile(goB, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env, argv = helperCmd("fencedwrite", store.srv.URL, "fresh", goB, resB)
	b := start(t, env, append(append(bArgs, "--"), argv...)...)
	waitFile(t, resB, 20*time.Second)
	if got, _ := os.ReadFile(resB); string(got) != "200 accepted" {
		t.Fatalf("the new holder's write: %q", got)
	}
	if st := status(t, c, resource); st.Token <= t1 {
		t.Fatalf("new token %d not above %d", st.Token, t1)
	}

	// The paused command resumes (before jetlock) and writes at once.
	if err := os.WriteFile(goA, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-child, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFile(t, resA, 10*time.Second)
	got, _ := os.ReadFile(resA)
	if !strings.HasPrefix(string(got), "409 ") || !strings.Contains(string(got), "stale") {
		t.Fatalf("the paused holder's late write: %q, want refused as stale", got)
	}
	if v := store.get(resource); v != "fresh" {
		t.Fatalf("store holds %q, want the new holder's value", v)
	}
	for _, pid := range []int{guard, a.cmd.Process.Pid} {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, a.wait(t, 20*time.Second), 79)
	if !groupGone(child) {
		t.Fatal("the paused command outlived jetlock")
	}
	return c, b
}

// childOf returns the pid of parent's only child (from /proc: the
// children of each of its threads).
func childOf(t *testing.T, parent int) int {
	t.Helper()
	for range 1000 {
		tasks, err := filepath.Glob("/proc/" + strconv.Itoa(parent) + "/task/*/children")
		if err != nil || len(tasks) == 0 {
			t.Skipf("no /proc children lists: %v", err)
		}
		for _, task := range tasks {
			b, _ := os.ReadFile(task)
			if f := strings.Fields(string(b)); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("jetlock started no command")
	return 0
}

// The hold cap ends a lease that keeps renewing: the command is stopped
// and jetlock exits 79 once --max-hold has passed.
func TestRunHoldCapEndsLease(t *testing.T) {
	t.Parallel()
	p := start(t, nil, "run", "--ttl", "1s", "--max-hold", "3s", "--grace", "200ms", "run:hold", "--", "sleep", "60")
	r := p.wait(t, 20*time.Second)
	wantCode(t, r, 79)
	if r.took < 2*time.Second || r.took > 10*time.Second {
		t.Fatalf("stopped after %v, want about the 3s hold cap", r.took)
	}
	if !strings.Contains(r.stderr, "hold") {
		t.Fatalf("stderr %q does not name the hold cap", r.stderr)
	}
}

// behindProxy returns a proxy to node 0 of the cluster that a test can cut,
// as when the network between jetlock and NATS fails.
func behindProxy(t *testing.T) *tcpproxy.Proxy {
	t.Helper()
	addr := strings.TrimPrefix(cluster.ClientURL(0), "nats://")
	p, err := tcpproxy.New(func() []string { return []string{addr} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// startVia starts jetlock like start, connected to url instead.
func startVia(t *testing.T, url string, args ...string) *proc {
	t.Helper()
	return start(t, nil, append([]string{"--server", url}, args...)...)
}

// renewalSeen waits until the service has seen a renewal of resource's
// lease: its expires_at moves. It returns the time of the last status that
// still showed the earlier expiry, before which the renewal was not yet
// sent (give or take one request's latency).
func renewalSeen(t *testing.T, resource string) time.Time {
	t.Helper()
	c := newClient(t)
	first := status(t, c, resource).ExpiresAt
	deadline := time.Now().Add(20 * time.Second)
	before := time.Now()
	for range 10_000 {
		asked := time.Now()
		st := status(t, c, resource)
		if !st.Held {
			t.Fatalf("%s not held", resource)
		}
		if !st.ExpiresAt.Equal(first) {
			return before
		}
		before = asked
		if asked.After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no renewal of %s seen in 20s", resource)
	return time.Time{}
}

// When jetlock can no longer reach NATS, its command is stopped so that
// it is gone (SIGKILL after the grace for one that ignores SIGTERM) before
// the lease's TTL since the last renewal that succeeded has passed — and
// so before the service may expire the lease and grant it to a waiting
// caller. jetlock then exits 79 at once: a release that cannot get through
// is not retried past the lease's deadline (it used to take 10s more).
func TestRunRenewalFailureStopsCommandBeforeTTL(t *testing.T) {
	t.Parallel()
	const (
		ttl   = 6 * time.Second
		grace = 2 * time.Second // the most a 6s TTL allows
	)
	resource := "run:unreachable"
	pidFile := filepath.Join(t.TempDir(), "pid")
	proxy := behindProxy(t)
	p := startVia(t, proxy.URL(), "run", "--ttl", ttl.String(), "--grace", grace.String(), resource, "--",
		"sh", "-c", `trap '' TERM; echo $$ > `+pidFile+`; i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done`)
	pid := pidOf(t, pidFile)
	renewedAfter := renewalSeen(t, resource)
	proxy.Cut()
	granted := waitForGrant(t, resource)

	deadline := time.Now().Add(20 * time.Second)
	for !groupGone(pid) {
		if time.Now().After(deadline) {
			t.Fatal("the command outlived the lease by 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := time.Now()
	t.Logf("command gone %v after the last renewal seen", gone.Sub(renewedAfter))
	// The last renewal was sent after renewedAfter, less a request's
	// latency (allow 500ms).
	if limit := renewedAfter.Add(ttl - 500*time.Millisecond); gone.After(limit) {
		t.Fatalf("the command went %v after the last renewal, want before the TTL (%v)", gone.Sub(renewedAfter), ttl)
	}
	if gone.Sub(renewedAfter) < ttl-time.Second-grace-time.Second {
		t.Fatalf("the command went %v after the last renewal: sooner than the deadline less the grace", gone.Sub(renewedAfter))
	}
	r := p.wait(t, 20*time.Second)
	wantCode(t, r, 79)
	if exited := p.start.Add(r.took); exited.Sub(gone) > 4*time.Second { // it used to take 10s
		t.Fatalf("jetlock exited %v after its command was gone, want at once", exited.Sub(gone))
	}
	if !strings.Contains(r.stderr, "no renewal confirmed") {
		t.Fatalf("stderr %q", r.stderr)
	}
	select {
	case at := <-granted:
		if !at.After(gone) {
			t.Fatalf("another caller was granted the lock %v before the command was gone", gone.Sub(at))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the lease never expired")
	}
}

// A command that ends by itself while NATS is unreachable: jetlock passes
// its code through after one request timeout of trying to release at most
// (it used to retry for twice that), never past the lease's deadline.
func TestRunExitsPromptlyWhenClusterGone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile, goFile := filepath.Join(dir, "pid"), filepath.Join(dir, "go")
	proxy := behindProxy(t)
	p := startVia(t, proxy.URL(), "run", "--ttl", "30s", "--timeout", "2s", "run:gone", "--", "sh", "-c",
		`echo $$ > `+pidFile+`; i=0; while [ ! -e `+goFile+` ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 3`)
	pid := pidOf(t, pidFile)
	proxy.Cut()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !groupGone(pid) {
		if time.Now().After(deadline) {
			t.Fatal("the command did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := time.Now()
	r := p.wait(t, 30*time.Second)
	exited := p.start.Add(r.took)
	t.Logf("jetlock exited %v after its command; stderr %q", exited.Sub(gone), r.stderr)
	if r.code != 3 {
		t.Fatalf("exit code %d, want the command's 3; stderr %q", r.code, r.stderr)
	}
	if d := exited.Sub(gone); d > 3*time.Second {
		t.Fatalf("jetlock exited %v after its command, want within the 2s request timeout (+1s)", d)
	}
	if !strings.Contains(r.stderr, "release") {
		t.Fatalf("stderr %q does not say the release failed", r.stderr)
	}
}

// waitForGrant has another caller wait for resource from now on, and
// sends the time it was granted (then releases it).
func waitForGrant(t *testing.T, resource string) <-chan time.Time {
	t.Helper()
	c := newClient(t)
	at := make(chan time.Time, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		l, err := c.Acquire(ctx, resource, client.Wait(25*time.Second), client.TTL(2*time.Second))
		if err != nil {
			return
		}
		at <- time.Now()
		_ = l.Release(ctx)
	}()
	return at
}
